"""Fuzzing the config and dataset parsers: every input parses or raises the documented error.

``llm.common.config.load_config`` may raise only ``ConfigError`` and ``llm.problems.tasks.load_jsonl`` only
``TaskDataError``, whatever the bytes. Inputs are drawn near the valid ones (the real schema
with wrong values, valid lines with broken fields) as well as arbitrary text and bytes.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import typing
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llm.common.config import ConfigError, RunConfig, config_from_dict, load_config
from llm.problems.tasks import Problem, TaskDataError, load_jsonl

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SECTIONS = {
    name: [f.name for f in dataclasses.fields(cls)]
    for name, cls in typing.get_type_hints(RunConfig).items()
}

scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["teamtr", "fixed", "random", "handoff", "jsonl", "exact", "quantile"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def config_tables(draw) -> dict:
    """A config near the schema: known sections and keys (and a few unknown ones), any values."""
    data: dict = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "extra"]), max_size=4, unique=True)):
        keys = SECTIONS.get(section, ["x"])
        chosen = draw(st.lists(st.sampled_from([*keys, "unknown_key"]), max_size=4, unique=True))
        data[section] = {key: draw(values) for key in chosen}
    if draw(st.booleans()):
        data["top_level"] = draw(values)
    return data


def write(directory: Path, name: str, content: bytes) -> Path:
    path = directory / name
    path.write_bytes(content)
    return path


@FUZZ
@given(config_tables())
@example({"stage": {"radius": float("nan")}})
@example({"team": {"n_agents": 2, "speaking_order": [0, 0]}})
@example({"team": {"role_prompts": ["a"], "n_agents": 3}})
@example({"task": {"kind": "jsonl"}})
@example({"lora": {"target_modules": [1]}})
def test_config_tables_parse_or_raise_config_error(data):
    try:
        config = config_from_dict(data, "fuzz.toml")
    except ConfigError:
        return
    assert isinstance(config, RunConfig)
    radii = (
        config.stage.radius if isinstance(config.stage.radius, tuple) else (config.stage.radius,)
    )
    assert min(radii) > 0 and config.sampler.group_size >= 2


toml_fragments = st.sampled_from(
    [
        "[stage]\n",
        "[run]\n",
        "[team]\n",
        "radius = ",
        "0.1",
        "-1",
        "nan",
        '"x"',
        "[",
        "]",
        "=",
        "\n",
        "stages = 2\n",
        "n_agents = ",
        "{a = 1}",
        "'''",
        "#",
        "[[stage]]\n",
        "\\u0000",
    ]
)


@FUZZ
@given(st.lists(toml_fragments, max_size=12).map("".join) | st.text(max_size=80))
@example("[stage]\nradius = nan\n")
@example("[stage]\nradius = inf\n")
@example("[[stage]]\nradius = 0.1\n")
@example("stage = 1\n")
def test_toml_text_parses_or_raises_config_error(text):
    with tempfile.TemporaryDirectory() as directory:
        path = write(Path(directory), "fuzz.toml", text.encode("utf-8", "surrogatepass"))
        try:
            assert isinstance(load_config(path), RunConfig)
        except ConfigError:
            pass


@FUZZ
@given(st.binary(max_size=80))
@example(b"\xff\xfe[stage]")
@example(b"[" * 2000)
def test_config_bytes_parse_or_raise_config_error(content):
    with tempfile.TemporaryDirectory() as directory:
        for name in ("fuzz.toml", "fuzz.json"):
            try:
                assert isinstance(load_config(write(Path(directory), name, content)), RunConfig)
            except ConfigError:
                pass


field_values = st.one_of(
    st.text(max_size=8),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
records = st.dictionaries(
    st.sampled_from(["question", "answer", "other"]), field_values, max_size=3
).map(json.dumps)
lines = st.one_of(records, st.text(max_size=20), st.just("  "), st.just('{"question": "q"'))


@FUZZ
@given(st.lists(lines, max_size=5))
@example(['{"question": "q", "answer": NaN}'])
@example(['{"question": "\\ud800", "answer": "1"}'])
@example(["[" * 5000])
def test_dataset_lines_parse_or_raise_task_data_error(content):
    with tempfile.TemporaryDirectory() as directory:
        text = "\n".join(content).encode("utf-8", "surrogatepass")
        path = write(Path(directory), "fuzz.jsonl", text)
        try:
            problems = load_jsonl(path)
        except TaskDataError:
            return
        assert problems and all(
            isinstance(p, Problem) and p.question and p.answer for p in problems
        )


@FUZZ
@given(st.binary(max_size=60))
@example(b'{"question": "q", "answer": "1"}\n\xff')
def test_dataset_bytes_parse_or_raise_task_data_error(content):
    with tempfile.TemporaryDirectory() as directory:
        try:
            assert load_jsonl(write(Path(directory), "fuzz.jsonl", content))
        except TaskDataError:
            pass
