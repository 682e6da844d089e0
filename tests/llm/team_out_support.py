"""A trained tiny team with private notes (and a reward that differs on a random
model, so that training moves the adapters), for the tests of ``teamtr chat``, ``export`` and
``eval --data``: a dataset task whose rows carry one note per agent, two role prompts, message
lengths of their own and three turns, trained one stage."""

from __future__ import annotations

import json
from pathlib import Path

from llm.interface.cli import main

ROWS = [
    {
        "question": f"What is {a} + {b}?",
        "answer": str(a + b),
        "note_a": f"a = {a}",
        "note_b": f"b = {b}",
        "source": "sum",
    }
    for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4)]
]
CONFIG = """
[model]
source = "tiny"
[lora]
rank = 4
[team]
n_agents = 2
system_prompt = "Add the two numbers."
role_prompts = ["You know a.", "You know b."]
[task]
kind = "dataset"
train_file = "rows.jsonl"
test_file = "rows.jsonl"
notes_columns = ["note_a", "note_b"]
reward = "varied:distinct_characters"
eval_size = 4
[sampler]
prompts_per_batch = 2
group_size = 2
turns = 3
max_new_tokens = [9, 5]
[updater]
learning_rate = 1e-2
steps = 1
[stage]
radius = 0.05
stages = 2
[run]
name = "notes"
output_dir = "runs"
"""


REWARD = '''
def distinct_characters(dialogue):
    """A reward that differs between the dialogues of a group even on a random model, so that
    both agents' adapters move away from zero."""
    return min(1.0, len(set("".join(dialogue.messages))) / 20)
'''


def train_notes_team(folder: Path, source: str = "tiny") -> Path:
    """Train the team on the model ``source`` in ``folder``; returns its run directory."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "varied.py").write_text(REWARD)
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    config = CONFIG.replace('"runs"', f'"{folder / "runs"}"')
    (folder / "team.toml").write_text(config.replace('source = "tiny"', f'source = "{source}"'))
    assert main(["train", "--config", str(folder / "team.toml"), "--no-progress"]) == 0
    return folder / "runs" / "notes"
