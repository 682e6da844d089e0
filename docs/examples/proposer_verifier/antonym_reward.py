"""The reward of the proposer/verifier example: the verifier names the answer, and only it."""

import string


def words(text):
    return text.lower().translate(str.maketrans("", "", string.punctuation)).split()


def score(dialogue):
    """1 / (words said) when the answer is among the verifier's words: the answer alone earns
    1, the answer inside a sentence of six words 1/6 (a signal while replies are long)."""
    said = words(dialogue.final)
    return 1 / len(said) if dialogue.problem.answer.lower() in said else 0.0


def exact(dialogue):
    """The held-out metric: the final message is the answer and nothing else."""
    return float(words(dialogue.final) == [dialogue.problem.answer.lower()])


exact.grading = True  # right or wrong: its held-out mean is reported as an accuracy
