"""The language-model backend keeps the protocols' promises (``teamtr.check_backend``), and its
public surface ``llm.build_team`` gives parts that ``teamtr.run_stage`` drives as it drives sim."""

from __future__ import annotations

import subprocess
import sys

import pytest
from llm_test_support import AlternatingRewards

import llm
from llm.common.config import ConfigError, RunConfig
from llm.training.builder import configured
from teamtr import StageConfig, check_backend, run_stage
from teamtr.conformance import CHECKS
from teamtr.stage import inside_radius

TINY = {
    "source": "tiny",
    "n_agents": 2,
    "prompts_per_batch": 2,
    "group_size": 2,
    "turns": 2,
    "max_new_tokens": 4,
    "learning_rate": 1e-2,
    "threads": 1,
}


def test_the_tiny_language_model_team_conforms():
    team, sampler, updater, _ = llm.build_team(**TINY)
    graded = AlternatingRewards(sampler)
    names = check_backend(team, graded, updater, radius=0.05)
    assert names == tuple(CHECKS)
    # The checks probe real moves: agent 0's first update changes its adapter inside the radius.
    update = updater.update(team, 0, graded.sample(team), 0.05)
    assert update.accepted and 0.0 < update.kl <= 0.05
    assert not update.policy.equal(team.agent(0))


def test_build_team_parts_run_a_stage_that_records_what_each_update_used():
    team, sampler, updater, penalty = llm.build_team(**TINY)
    report, final = run_stage(
        team, AlternatingRewards(sampler), updater, StageConfig(radius=0.05), penalty
    )
    assert [r.agent for r in report.records] == [0, 1]
    assert report.records[0].base is team
    for record in report.records:
        # teamtr: every update is trained on rollouts of the team it starts from (Thm 3.4).
        assert record.rollouts.behaviour is record.base
    # Agent 0's first update is the one the conformance test above sees accepted inside the
    # radius: it is kept, charged its penalty and moves the team the next agent starts from.
    first, second = report.records
    assert first.kept and first.update.accepted
    assert 0.0 < first.update.kl <= 0.05 * (1 + StageConfig().kl_tolerance)
    assert first.penalty > 0.0 and first.certificate == first.update.surrogate - first.penalty
    assert second.base is not team and second.base.agent(0) is first.update.policy
    for record in report.records:  # kept exactly when inside the radius; else charged nothing
        assert record.kept == inside_radius(record.update, 0.05, StageConfig().kl_tolerance)
        if not record.kept:
            assert record.penalty == 0.0 and record.certificate == 0.0
    assert report.sampled_rollouts[0] is report.records[0].rollouts
    assert penalty.horizon == 2 and final.n_agents == 2


def test_build_team_keywords_name_config_keys():
    with pytest.raises(ConfigError, match="role_prompts"):  # the default roles are for 2 agents
        configured(RunConfig(), {"source": "tiny", "n_agents": 4})
    keys = {"role_prompts": (), "max_new_tokens": 24, "group_size": 8, "turns": 4}
    config = configured(RunConfig(), {"source": "tiny", "n_agents": 4, **keys})
    assert (config.model.source, config.team.n_agents, config.sampler.group_size) == (
        "tiny",
        4,
        8,
    )
    with pytest.raises(ConfigError, match="no_such_key"):
        configured(RunConfig(), {"no_such_key": 1})
    with pytest.raises(ConfigError, match="n_agents"):
        configured(RunConfig(), {"n_agents": 0})


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--help"], 0),
        (["train", "--config", "no-such-config.toml"], 2),
        (["train", "--config", "smoke", "--set", "run.no_such_key=1"], 2),
        (["eval", "--config", "no-such-config.toml", "--json", "out.json"], 2),
        (["plot", "--run", "no-such-run"], 2),
    ],
)
def test_a_command_stopped_by_bad_input_or_help_imports_no_torch(argv, code, tmp_path):
    """The CLI catches every fault with its exit code without importing what raises it
    (``llm.common.command_faults``), and a command reads its arguments and config before it
    imports torch: a typo ends in half a second, not five."""
    program = (
        "import sys; from llm.interface.cli import main; "
        "code = main(sys.argv[1:]); print(code, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", program, *argv], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.split()[-2:] == [str(code), "False"], out.stdout + out.stderr
    assert code == 0 or out.stderr.startswith("error: "), out.stderr


def test_import_llm_is_light():
    code = "import sys, llm; print('torch' in sys.modules, callable(llm.build_team))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
