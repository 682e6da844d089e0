"""One greedy dialogue of a `teamtr export` folder through a vLLM server that serves it, with the
official `openai` client and team.json alone (no tokenizer, no teamtr).

    pip install openai
    python chat_with_openai.py EXPORT URL "question" [NOTE_FOR_AGENT_0 NOTE_FOR_AGENT_1 ...]

Start the server from EXPORT with the line its README.md prints (it listens on
http://127.0.0.1:8000 and lets in only requests that carry the key in VLLM_API_KEY), then give
its address as URL; the key is read from VLLM_API_KEY here too, never from the command line. Every turn is one `client.chat.completions.create` under the speaker's adapter
(`model="agent0"`) with the speaker's view of the dialogue so far as chat messages (team.json's
"chat": the system prompt and question, then per turn the speaker's header as a system message
and its message as the assistant's, then the speaking agent's own header), played greedily up to
its longest message. Where team.json's "chat" says `renders_as_teamtr`, the server renders these
messages as teamtr renders its dialogues; else play_with_vllm.py is the route. Prints each turn,
then a JSON line of every message's text and tokens (the server's `token_ids`).
"""

import json
import os
import sys

from openai import OpenAI

folder, url, question, *notes = sys.argv[1:]
team = json.load(open(f"{folder}/team.json"))
assert team["router"]["kind"] == "fixed", "this script plays a fixed speaking order"
chat = team["chat"]
if not chat["renders_as_teamtr"]:
    print(f"warning: {chat['checked']}; play_with_vllm.py plays as teamtr does", file=sys.stderr)
agents = {agent["speaker"]: agent for agent in chat["agents"]}
client = OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key=os.environ.get("VLLM_API_KEY", "none"))


def view(turns, speaker):  # the speaker's view, before its turn, of the dialogue so far
    def header(j):  # speaker j's system message; its note only in its own view
        note = notes[j] if j == speaker and j < len(notes) else ""
        text = "\n".join(part for part in (note, agents[j]["header"]) if part)
        return [{"role": "system", "content": text}] if text else []

    messages = [
        {"role": "system", "content": team["system_prompt"]},
        {"role": "user", "content": question},
    ]
    for j, text in turns:
        messages += [*header(j), {"role": "assistant", "content": text}]
    return messages + header(speaker)


turns, played = [], []
order = team["router"]["speaking_order"]
for t in range(team["turns"]):
    k = order[t % len(order)]
    answer = client.chat.completions.create(
        model=agents[k]["model"],
        messages=view(turns, k),
        max_tokens=agents[k]["max_tokens"],
        temperature=chat["request"]["temperature"],  # 0: greedy, as teamtr chat plays
        # vLLM's own: stop at the chat's stop token; keep special tokens in the text, so that
        # the next request renders the message back to its tokens; return the tokens.
        extra_body={**chat["request"]["extra_body"], "return_token_ids": True},
    )
    choice = answer.choices[0]
    text = choice.message.content or ""
    turns.append((k, text))
    played.append({"agent": k, "text": text, "tokens": getattr(choice, "token_ids", None)})
    print(f"agent {k}: {text}")
print(json.dumps(played))
