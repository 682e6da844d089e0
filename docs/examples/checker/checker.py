"""A checker environment: after agent 0's message it says whether the number in it is the
answer; agent 1 then answers. What an environment is and its rules: docs/environments.md."""

import re

from llm.problems.environment import Opening, Reply
from llm.problems.tasks import Problem

NUMBER = re.compile(r"-?\d+")


class Checker:
    """One per dialogue: ``reset`` opens it, ``step`` answers each message."""

    def reset(self, problem: Problem, seed: int) -> Opening:
        self.answer = problem.answer  # the dialogue's problem: what the checker checks against
        return Opening(problem.question)  # the opening every agent sees: the question

    def step(self, speaker: int, message: str) -> Reply:
        if speaker == 1:
            return Reply(done=True)  # the answerer's message ends the dialogue
        found = NUMBER.findall(message)
        if not found:
            return Reply(text="checker: no number to check")
        verdict = "right" if found[-1] == self.answer else "wrong"
        return Reply(text=f"checker: {found[-1]} is {verdict}")
