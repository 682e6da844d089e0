"""The language-model world checks a radius by the core's one rule (``teamtr.trust_region``).

``[stage]`` is a ``teamtr.StageConfig``: a bad radius in a config file is reported with the
core's message, placed at the file, line and key; the one check the config adds is the count
of per-agent radii against the team, through the core's ``StageConfig.radii``.
"""

from __future__ import annotations

import pytest

from llm.common.config import ConfigError, StageSettings, load_config
from teamtr.config import DEFAULT_RADIUS, StageConfig
from teamtr.trust_region import RADIUS_RULE

RULE = RADIUS_RULE.removeprefix("radius ")


@pytest.mark.parametrize(
    ("written", "got"),
    [
        ("0.0", "0.0"),
        ("-1", "-1.0"),
        ("[0.1, -0.2]", "-0.2 for agent 1"),
        ("[0.1, 0]", "0.0 for agent 1"),
    ],
)
def test_a_bad_radius_in_a_config_file_is_the_core_error_at_its_line(tmp_path, written, got):
    path = tmp_path / "c.toml"
    path.write_text(f'[team]\nn_agents = 2\n\n[stage]\nscheme = "teamtr"\nradius = {written}\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == f"{path}:6: [stage] radius: {RULE}, got {got}"


def test_the_count_of_radii_is_checked_by_the_core_against_the_team(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[team]\nn_agents = 2\n\n[stage]\nradius = [0.1, 0.2, 0.3]\n")
    with pytest.raises(ConfigError, match=r"c\.toml:5: \[stage\] radius: needs one entry per"):
        load_config(path)
    with pytest.raises(ValueError, match="one value per agent: 3 given for a team of 2 agents"):
        StageConfig(radius=(0.1, 0.2, 0.3)).radii(2)


def test_the_language_model_default_is_its_own_and_checked_like_any_other():
    assert isinstance(StageSettings(), StageConfig)
    assert StageSettings().radius == 0.1 != DEFAULT_RADIUS
    with pytest.raises(ValueError) as raised:
        StageSettings(radius=float("nan"))
    assert str(raised.value) == f"{RADIUS_RULE}, got nan"
