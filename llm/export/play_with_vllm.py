"""One greedy dialogue of a `teamtr export` folder through a vLLM server that serves it, with the
standard library and the team's tokenizer alone (every export carries a copy of this file).

    python play_with_vllm.py EXPORT URL "question" [NOTE_FOR_AGENT_0 NOTE_FOR_AGENT_1 ...]

Start the server from EXPORT with the line its README.md prints (it listens on
http://127.0.0.1:8000 and lets in only requests that carry the key in VLLM_API_KEY), then give
its address as URL; the key is read from VLLM_API_KEY here too, never from the command line. Every turn is one completion request under the speaker's
adapter (`"model": "agent0"`): the speaker's context rendered as teamtr renders it (team.json;
the same rendering as play_with_peft.py), sent as token ids, played greedily (temperature 0) up
to the speaker's longest message or the chat's stop token. This route plays every dialogue as
teamtr does, whatever the base model's chat template (team.json's "chat" says where chat
messages do too). Prints each turn, then a JSON line of every message's tokens.
"""

import json
import os
import sys
import urllib.request


def main(folder, url, question, *notes):
    from transformers import AutoTokenizer

    team = json.load(open(f"{folder}/team.json"))
    assert team["router"]["kind"] == "fixed", "this script plays a fixed speaking order"
    gen, agents = team["generation"], team["agents"]
    tok = AutoTokenizer.from_pretrained(f"{folder}/{team['tokenizer']}")

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
    key = os.environ.get("VLLM_API_KEY")

    def complete(adapter, ids, max_tokens):
        body = {
            "model": adapter,
            "prompt": ids,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stop_token_ids": [stop],
            "ignore_eos": True,  # the message ends at the chat's stop token, not the tokenizer's
            "skip_special_tokens": False,
            "return_token_ids": True,
        }
        request = urllib.request.Request(
            f"{url.rstrip('/')}/v1/completions",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {key}"} if key else {}),
            },
        )
        with urllib.request.urlopen(request, timeout=600) as answer:
            choice = json.load(answer)["choices"][0]
        tokens = [int(t) for t in choice["token_ids"]]
        return tokens[: tokens.index(stop) + 1] if stop in tokens else tokens

    prompt = encode(render([system, {"role": "user", "content": question}]))
    turns: list[tuple[int, list[int]]] = []
    for t in range(team["turns"]):
        order = team["router"]["speaking_order"]
        k = order[t % len(order)]
        ids = list(prompt)
        for speaker, message in turns:  # the transcript in speaker k's view
            tail = closing if message[-1:] == [stop] else [stop, *closing]
            ids += header(speaker, speaker == k) + message + tail
        ids += header(k, True)
        message = complete(agents[k]["adapter"], ids, agents[k]["max_new_tokens"])
        turns.append((k, message))
        print(f"agent {k}: {tok.decode(message, skip_special_tokens=True)}")
    print(json.dumps([{"agent": k, "tokens": m} for k, m in turns]))


if __name__ == "__main__":
    main(*sys.argv[1:])
