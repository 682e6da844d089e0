"""The stages of a training run: the loop that runs them from a resume point, what each stage
records (its line of ``metrics.jsonl``, its scalars, where the run stands) and what it prints.
``llm.training.train`` starts and resumes runs and hands their stages to ``run_stages``.
"""
