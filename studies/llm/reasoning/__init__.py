"""The reasoning-gym comparison of docs/reasoning_gym.md: ``comparison`` reads the runs of a team,
teamtr's single agent and TRL's GRPOTrainer and makes its table and figure;
``rescore_transcripts`` scores saved held-out transcripts again by a config's metric as it is now.
"""
