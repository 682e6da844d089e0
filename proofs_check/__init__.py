"""Hypothesis strategies and property tests of every lemma and theorem in THEORY.md."""
