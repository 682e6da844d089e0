"""The reward of the proposer/verifier example: the verifier's final word is the answer."""

import string


def score(dialogue):
    words = dialogue.final.lower().translate(str.maketrans("", "", string.punctuation)).split()
    return float(words == [dialogue.problem.answer.lower()])
