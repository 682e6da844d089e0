"""Tabular turn-taking MDPs with exact occupancies, values and trust-region updates."""
