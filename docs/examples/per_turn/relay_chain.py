"""A task in code with per-turn rewards: a relay chain of n agents.

The first speaker holds a private number (a note only it sees); every later speaker must say the
number it heard. Each turn that states the first number earns its share: one reward per turn,
so the middle of the chain is paid for passing the number on, whatever the last speaker says.
The held-out questions are asked in a phrasing never trained on.
"""

import re

import llm

TRAIN_QUESTIONS = (
    "The first of {n} teammates holds a private number. Pass it along: every speaker says it.",
    "Only the first speaker can see the number. Each of the {n} teammates repeats it in turn.",
)
TEST_QUESTION = "{n} teammates relay one hidden number, known to the first, down the line."


def every_turn_states_the_number(dialogue):
    """1 for each turn whose first number is the first speaker's number, else 0."""
    return [
        float(re.findall(r"-?\d+", message)[:1] == [dialogue.problem.answer])
        for message in dialogue.messages
    ]


def make(n_agents=3, note_max=50):
    def problem(question, number):
        notes = (f"Your private number is {number}.",) + ("",) * (n_agents - 1)
        return llm.Problem(question.format(n=n_agents), str(number), notes=notes)

    def draw(rng, count):
        return [
            problem(TRAIN_QUESTIONS[rng.integers(2)], int(rng.integers(1, note_max + 1)))
            for _ in range(count)
        ]

    test = [problem(TEST_QUESTION, number) for number in range(1, note_max + 1)]
    roles = ["You speak first. Say only your private number."]
    roles += ["Say only the number the previous speaker said."] * (n_agents - 1)
    return llm.Task(
        train=draw,
        test=test,
        reward=every_turn_states_the_number,
        roles=llm.Roles(role_prompts=tuple(roles), max_new_tokens=8),
        name="relay chain",
        split=lambda identity: "test" if identity.startswith(TEST_QUESTION[4:14]) else "train",
    )
