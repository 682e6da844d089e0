"""The graders of the built-in tasks, kept importable here: their one home is ``llm.rewards``
(``llm.rewards.grading``), where every ready-made reward lives."""

from llm.rewards.grading import Grade, grade, running_sum_reward, running_sum_turns

__all__ = ["Grade", "grade", "running_sum_reward", "running_sum_turns"]
