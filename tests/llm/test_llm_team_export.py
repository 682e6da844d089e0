"""A trained team taken out of its run: ``teamtr export`` writes PEFT adapter folders that
``docs/examples/exported_team/play_with_peft.py`` plays with transformers and PEFT alone, and
its greedy dialogue is ``teamtr chat``'s token for token, its log-probs teamtr's to float32
rounding, for the adapters and for the merged models (tiny model, private notes, two roles,
message lengths of their own, three turns)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest
import torch
from llm_test_support import (
    FLOAT32_EPSILON,
    REPO,
    gamma,
    logit_resolution,
    teamtr_free_python,
)
from safetensors.torch import load_file
from team_out_support import ROWS

import llm
from llm.engines.vllm.command import vllm_rank
from llm.interface.cli import main
from llm.models.agents import slot_name

EXAMPLE = REPO / "docs" / "examples" / "exported_team" / "play_with_peft.py"
QUESTION = "What is 3 + 5?"
NOTES = ("a = 3", "b = 5")


@pytest.fixture(scope="module")
def exported(notes_run, tmp_path_factory):
    """A trained run, its export with the base and merged models, and ``teamtr chat``'s
    dialogue of QUESTION with NOTES (as written by ``--json``)."""
    folder = tmp_path_factory.mktemp("team_out")
    run = notes_run
    out = folder / "export"
    with contextlib.redirect_stdout(io.StringIO()) as printed_by_export:
        assert main(["export", "--run", str(run), "--out", str(out), "--with-base", "--merge"]) == 0
    vllm_line = "python -m vllm.entrypoints.openai.api_server --model ./base"
    assert vllm_line in printed_by_export.getvalue()
    chat_json = folder / "chat.json"
    notes = [argument for note in NOTES for argument in ("--note", note)]
    chat = ["chat", "--run", str(run), "--question", QUESTION, *notes, "--json", str(chat_json)]
    with contextlib.redirect_stdout(io.StringIO()) as printed_by_chat:
        assert main(chat) == 0
    dialogue = json.loads(chat_json.read_text())["dialogues"][0]
    printed = [
        line for line in printed_by_chat.getvalue().splitlines() if line.startswith("agent ")
    ]
    assert [line.split(":")[0] for line in printed] == ["agent 0", "agent 1", "agent 0"]
    return run, out, dialogue


def played_by_example(out: Path, *flags: str) -> list[dict]:
    done = teamtr_free_python(EXAMPLE, str(out), QUESTION, *NOTES, *flags)
    return json.loads(done.splitlines()[-1])


def token_tolerance(run: Path, dialogue: dict) -> float:
    """float32 rounding of one token's log-probability, from what its forward passes sum
    (``llm_test_support``): the longest context, the adapter's rank terms in every adapted
    projection, the vocabulary of the log-sum-exp, at the policy's temperature."""
    trained = llm.load_team(run, device="cpu")
    model_config = trained.team.backbone.model.get_base_model().config
    temperature = trained.config.sampler.temperature
    rank = trained.config.lora.rank
    problem = trained.problem(dialogue["question"], dialogue["notes"])
    episode = trained.episodes([problem])[0]
    positions, largest = 0, 0.0
    for speaker in range(trained.n_agents):
        ids, _ = trained.chat.assemble(episode, trained.chat.view_of(episode, speaker))
        positions = max(positions, len(ids))
        with torch.no_grad():
            logits = trained.team.use(speaker)(torch.tensor([ids])).logits
        largest = max(largest, float(logits.abs().max()))
    assert largest < 1.0  # the premise of logit_resolution
    per_logit = logit_resolution(model_config, positions, rank)
    return 2 * per_logit / temperature + (
        model_config.vocab_size * FLOAT32_EPSILON * largest / temperature
    )


@pytest.mark.parametrize("flags", [(), ("--merged",)], ids=["peft_adapters", "merged_models"])
def test_the_example_plays_teamtr_chats_dialogue_token_for_token(exported, flags):
    run, out, chat = exported
    played = played_by_example(out, *flags)
    assert [turn["agent"] for turn in played] == [turn["agent"] for turn in chat["turns"]]
    assert [turn["tokens"] for turn in played] == [turn["tokens"] for turn in chat["turns"]]
    assert any(len(turn["tokens"]) > 1 for turn in played)
    tolerance = token_tolerance(run, chat)
    for theirs, ours in zip(played, chat["turns"], strict=True):
        difference = torch.tensor(theirs["logps"]) - torch.tensor(ours["logps"])
        assert difference.abs().max() <= tolerance
        # a message's log-prob sums its tokens': their roundings add up
        assert abs(float(difference.sum())) <= tolerance * len(ours["tokens"])


def test_each_agent_is_a_peft_adapter_with_its_true_rank_alpha_and_modules(exported):
    from peft import PeftConfig

    run, out, _ = exported
    team = json.loads((out / "team.json").read_text())
    config = json.loads((run / "config.json").read_text())
    for agent in (0, 1):
        adapter = out / f"agent{agent}"
        written = json.loads((adapter / "adapter_config.json").read_text())
        assert written["peft_type"] == "LORA"
        assert written["r"] == config["lora"]["rank"] == 4
        assert written["lora_alpha"] == config["lora"]["alpha"]
        assert set(written["target_modules"]) == {
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        }
        assert written["base_model_name_or_path"] == "base"  # the export's own copy
        assert PeftConfig.from_pretrained(str(adapter)).r == 4
        weights = load_file(str(adapter / "adapter_model.safetensors"))
        checkpoint = load_file(str(run / "checkpoints" / "stage_2" / f"agent{agent}.safetensors"))
        assert weights.keys() == checkpoint.keys()
        assert all(torch.equal(weights[k], checkpoint[k]) for k in weights)
    assert [a["role_prompt"] for a in team["agents"]] == ["You know a.", "You know b."]
    assert [a["max_new_tokens"] for a in team["agents"]] == [9, 5]
    assert team["turns"] == 3 and team["router"] == {"kind": "fixed", "speaking_order": [0, 1]}
    assert team["system_prompt"] == "Add the two numbers."
    assert team["teamtr"]["checkpoint"] == f"{run.name}/checkpoints/stage_2"
    assert len(team["base"]["sha256"]) == 64
    assert (
        f"--enable-lora --max-loras 2 --max-lora-rank {vllm_rank(4)} --lora-modules "
        "agent0=./agent0 agent1=./agent1"
    ) in team["vllm"]
    assert vllm_rank(4) == 8 and vllm_rank(16) == 16
    # The shell stops the line unless the key is in VLLM_API_KEY, where vLLM reads it.
    guard, line = team["vllm"].split(" && ", 1)
    assert guard.startswith(': "${VLLM_API_KEY:?') and team["vllm_serve"].startswith(guard)
    assert line.startswith("VLLM_CPU_KVCACHE_SPACE=4 python -m")
    assert "--model ./base --host 127.0.0.1 --dtype float32" in line
    card = (out / "README.md").read_text()
    assert team["vllm"] in card and team["vllm_serve"] in card


def test_a_merged_model_holds_its_adapter_with_alpha_over_r(exported):
    """Not the base (a merge that wrote the base back), not B A without its scaling."""
    from transformers import AutoModelForCausalLM

    _, out, _ = exported
    base = AutoModelForCausalLM.from_pretrained(out / "base").state_dict()
    name = "model.layers.0.self_attn.q_proj"
    for agent in ("agent0", "agent1"):
        merged = AutoModelForCausalLM.from_pretrained(out / "merged" / agent).state_dict()
        adapter = load_file(str(out / agent / "adapter_model.safetensors"))
        lora_a = adapter[f"base_model.model.{name}.lora_A.weight"]
        lora_b = adapter[f"base_model.model.{name}.lora_B.weight"]
        assert lora_b.abs().max() > 0  # trained: B starts at 0
        weight, scaling = base[f"{name}.weight"].double(), 32.0 / 4
        exact = weight + scaling * (lora_b.double() @ lora_a.double())
        assert not torch.equal(merged[f"{name}.weight"], base[f"{name}.weight"])
        # The merge's float32 W + s B A (an addmm: r products, their sum, the scaling and the
        # add of W, at most r + 2 roundings a term in whatever order the BLAS library takes)
        # is within gamma_{r+2} (|W| + s |B| |A|) of the exact sum (llm_test_support.gamma).
        rank = lora_a.shape[0]
        terms = weight.abs() + scaling * (lora_b.double().abs() @ lora_a.double().abs())
        error = (merged[f"{name}.weight"].double() - exact).abs()
        assert (error <= gamma(rank + 2) * terms).all()


def test_load_team_plays_an_export_as_it_plays_its_run(exported):
    run, out, chat = exported
    from_run = llm.load_team(str(run), device="cpu")
    from_export = llm.load_team(out, device="cpu")
    for team in (from_run, from_export):
        dialogue = team.play(QUESTION, NOTES)
        assert isinstance(dialogue, llm.Dialogue)
        assert dialogue.speakers == (0, 1, 0)
        assert dialogue.messages == tuple(turn["text"] for turn in chat["turns"])
    batch = from_export.play_all(
        [from_export.problem(r["question"], (r["note_a"], r["note_b"])) for r in ROWS[:3]]
    )
    assert [d.problem.question for d in batch] == [r["question"] for r in ROWS[:3]]
    assert batch[0] == from_export.play(ROWS[0]["question"], (ROWS[0]["note_a"], ROWS[0]["note_b"]))


def test_a_team_trained_in_python_is_saved_and_loaded_again(tmp_path):
    import teamtr

    settings = {
        "source": "tiny",
        "rank": 4,
        "max_new_tokens": 6,
        "group_size": 2,
        "prompts_per_batch": 2,
    }
    team, sampler, updater, penalty = llm.build_team(**settings)
    stage = teamtr.StageConfig(radius=0.05)
    _, trained = teamtr.run_stage(team, sampler, updater, stage, penalty)
    written = llm.save_team(trained, tmp_path / "mine", **settings)
    assert (written / "base" / "model.safetensors").is_file()  # a tiny base is written
    loaded = llm.load_team(written, device="cpu")
    assert all(
        torch.equal(loaded.team.agent(k).tensors[key], trained.agent(k).tensors[key])
        for k in range(2)
        for key in trained.agent(k).tensors
    )
    slot = slot_name(0)
    assert slot in loaded.team.backbone.model.peft_config
    question = "What is 2 + 2?"
    assert loaded.play(question) == llm.TrainedTeam.of_team(
        loaded.config, trained, loaded.tokenizer, "here"
    ).play(question)


def test_chat_refuses_bad_input_in_one_line_before_loading_a_model(
    exported, tmp_path, capsys, monkeypatch
):
    """Each bad input is its own one-line error, and no model is built for it: every model
    construction (``PreTrainedModel.__init__``, whatever loads it) is counted, and a good
    question afterwards shows the count sees one."""
    from transformers import PreTrainedModel

    built = []
    construct = PreTrainedModel.__init__

    def counted(self, *args, **kwargs):
        built.append(type(self).__name__)
        construct(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "__init__", counted)
    run, out, _ = exported
    absent = tmp_path / "absent"
    cases = {
        "no such run": (
            ["--run", str(absent), "--question", "q"],
            f"{absent}: no such directory",
        ),
        "not a run": (
            ["--run", str(tmp_path), "--question", "q"],
            f"{tmp_path}: neither a run directory (no config.json) nor an export",
        ),
        "wrong number of notes": (
            ["--run", str(run), "--question", "q", "--note", "one"],
            "--note: 1 notes for a team of 2 agents",
        ),
        "step without checkpoint": (
            ["--run", str(run), "--question", "q", "--step", "7"],
            f"{run / 'checkpoints' / 'stage_7'}: no such checkpoint",
        ),
        "step of another export": (
            ["--run", str(out), "--question", "q", "--step", "0"],
            f"{out}: an export holds one checkpoint (stage_2); --step 0 names another",
        ),
        "empty question": (["--run", str(run), "--question", " "], "--question: empty"),
    }
    for case, (arguments, message) in cases.items():
        capsys.readouterr()
        assert main(["chat", *arguments]) == 2, case
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (case, captured.err)
        assert message in lines[0], (case, lines[0])
        assert captured.out == ""
        assert built == [], (case, built)
    capsys.readouterr()
    assert main(["export", "--run", str(run), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    notes = [argument for note in NOTES for argument in ("--note", note)]
    assert main(["chat", "--run", str(run), "--question", QUESTION, *notes]) == 0
    assert built, "a good question loads the team's model"


def test_chat_without_a_question_reads_them_from_stdin(exported, monkeypatch, capsys):
    run, _, chat = exported
    notes = [argument for note in NOTES for argument in ("--note", note)]
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{QUESTION}\nWhat is 1 + 1?\n\n"))
    capsys.readouterr()
    assert main(["chat", "--run", str(run), *notes]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("agent ")]
    assert len(printed) == 6  # two questions, three turns each
    assert printed[0] == f"agent 0: {chat['turns'][0]['text']}".splitlines()[0]


def test_chat_set_changes_the_runs_config_for_its_dialogues(exported, tmp_path, capsys):
    run, out, chat = exported
    notes = [argument for note in NOTES for argument in ("--note", note)]
    assert max(len(turn["tokens"]) for turn in chat["turns"]) > 2  # the run's [9, 5] tokens
    for source in (run, out):  # a run directory and its export
        written = tmp_path / f"{source.name}.json"
        arguments = ["--run", str(source), "--question", QUESTION, *notes, "--json", str(written)]
        assert main(["chat", *arguments, "--set", "sampler.max_new_tokens=2"]) == 0
        turns = json.loads(written.read_text())["dialogues"][0]["turns"]
        assert len(turns) == len(chat["turns"])
        assert all(1 <= len(turn["tokens"]) <= 2 for turn in turns)
        assert turns[0]["tokens"] == chat["turns"][0]["tokens"][:2]  # the same greedy start
    capsys.readouterr()
    arguments = ["--run", str(run), "--question", QUESTION, *notes]
    assert main(["chat", *arguments, "--set", "sampler.max_new_tokenz=2"]) == 2
    error = capsys.readouterr().err
    assert "--set sampler.max_new_tokenz: unknown key" in error
    assert "did you mean 'max_new_tokens'?" in error


def test_export_host_names_where_the_lines_listen_and_a_blank_one_is_refused(
    notes_run, tmp_path, capsys
):
    """``--host`` moves the lines off loopback (the card's address then names it); a blank
    one is one error line, exit 2, before anything is written."""
    out = tmp_path / "on_lan"
    assert main(["export", "--run", str(notes_run), "--out", str(out), "--host", "10.1.2.3"]) == 0
    team = json.loads((out / "team.json").read_text())
    for line in (team["vllm"], team["vllm_serve"]):
        words = line.split(" && ", 1)[1].split()
        assert words[words.index("--host") + 1] == "10.1.2.3"
    assert team["vllm_url"] == "http://10.1.2.3:8000"
    assert "play_with_vllm.py . http://10.1.2.3:8000" in (out / "README.md").read_text()
    capsys.readouterr()
    blank = ["export", "--run", str(notes_run), "--out", str(tmp_path / "no"), "--host", " "]
    assert main(blank) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--host" in errors[0], err
    assert not (tmp_path / "no").exists()
