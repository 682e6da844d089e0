"""The reward of the proposer/verifier example: the verifier's final word is the answer."""

import string


def words(text):
    return text.lower().translate(str.maketrans("", "", string.punctuation)).split()


def score(dialogue):
    """1 for the answer alone, 0.5 for the answer among other words (a signal to learn from)."""
    said = words(dialogue.final)
    answer = dialogue.problem.answer.lower()
    return 1.0 if said == [answer] else 0.5 if answer in said else 0.0


def exact(dialogue):
    """The held-out metric: the final message is the answer and nothing else."""
    return float(words(dialogue.final) == [dialogue.problem.answer.lower()])
