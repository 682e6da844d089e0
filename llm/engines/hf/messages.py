"""One message per context, sampled with the key/value cache, and the caches it starts from.

``generate_messages`` runs each group's prompt once (its rows continue from that cache) and,
given the contexts a speaker snapshot read in earlier draws (``llm.engines.hf.context_cache``),
continues each row from the longest prefix whose keys and values it already has. Either way the
messages are drawn from the speaker's own softmax(logits / T): the cached keys and values are
those a fresh prefill of the same tokens computes (causal attention), up to float rounding.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from peft import PeftModel
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from llm.common import profiling
from llm.common.devices import model_device
from llm.common.hf_compat import cache_argument, cache_of
from llm.conversation.dialogue import ChatFormat
from llm.engines.hf.context_cache import ContextCaches, ContextSource, LayerTensors, SnapshotKey
from llm.engines.hf.draw import CoupledDraw, Draw, InverseCdfDraw


def generate_messages(
    model: PreTrainedModel | PeftModel,
    contexts: Sequence[Sequence[int]],
    chat: ChatFormat,
    max_new_tokens: int,
    temperature: float,
    prompt_lengths: Sequence[int] | None = None,
    sampled_logps: list[torch.Tensor] | None = None,
    kept: tuple[ContextCaches, SnapshotKey] | None = None,
    draw: Draw = "multinomial",
    seeds: Sequence[int] | None = None,
) -> list[tuple[int, ...]]:
    """One message per context, sampled with the KV cache (temperature 0 = greedy).

    Pure sampling from softmax(logits / temperature): no top-k/top-p/repetition warpers, so
    the messages follow exactly the policy the updater trains.

    ``prompt_lengths`` (one per context) marks each context's first tokens as its prompt: every
    distinct prompt then runs through the model once, and its rows continue from that key/value
    cache (causal attention: a prompt's keys and values do not depend on what follows it), so a
    group of G dialogues on one problem pays for its prompt once instead of G times.

    ``kept`` (with ``prompt_lengths``): the contexts ``model``'s snapshot read before
    (``llm.engines.hf.context_cache``). A row whose context shares a longer prefix with one of
    them than its prompt continues from that context's keys and values; afterwards every row's
    context is kept there for later calls.

    ``sampled_logps``, when a list is given (sampling only), receives one tensor per message: the
    log-probability of each of its tokens under the distribution it was drawn from,
    log softmax(logits / T), as the generating model computed it (for measuring its gap from the
    training forward pass, ``bench/behaviour_logp_gap.py``).

    ``draw`` (sampling only): how each token is drawn from that softmax
    (``llm.engines.hf.draw``). ``seeds`` (one per context, sampling only): each row's tokens are
    drawn from its own seed's numbers instead, whatever ``draw`` says (coupled rows,
    ``llm.engines.hf.draw.CoupledDraw``).
    """
    layout = None
    if prompt_lengths is None:
        input_ids, attention = _left_padded(contexts, chat.pad_id)
        cache = None
    else:
        caches, key = kept if kept is not None else (None, None)
        layout = _cached_layout(model, contexts, chat, prompt_lengths, caches, key)
        input_ids, attention, cache = layout.input_ids, layout.attention, layout.cache
    greedy = temperature == 0
    record = sampled_logps is not None
    keeping = kept is not None and layout is not None and layout.keepable
    if (record or seeds is not None) and greedy:
        raise ValueError("sampled_logps and seeds need sampling (temperature > 0)")
    processor = _draw_processor(temperature, draw, seeds, [] if record else None)
    sampling = not greedy and processor is None
    config = _generation_config(
        chat, max_new_tokens, temperature if sampling else None, record, keeping
    )
    output = _generate(model, input_ids, attention, cache, config, processor)
    sequences = output.sequences if record or keeping else output
    if keeping:
        assert kept is not None and layout is not None
        layout.keep_contexts(contexts, cache_of(output), *kept)
    width = input_ids.shape[1]
    new_tokens = sequences[:, width:]
    drawn = _drawn_logps(output, processor, new_tokens) if sampled_logps is not None else None
    messages = _cut_at_stop(new_tokens, chat.stop_id, drawn, sampled_logps)
    profiling.count("generated tokens", sum(len(m) for m in messages))
    profiling.count("generation steps", sequences.shape[1] - width)
    profiling.count("generation rows", len(contexts))
    return messages


def _generate(
    model: PreTrainedModel | PeftModel,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    cache: typing.Any,
    config: GenerationConfig,
    processor: InverseCdfDraw | CoupledDraw | None,
) -> typing.Any:
    """``model.generate`` on the laid-out batch, continuing from ``cache`` where one is given."""
    device = model_device(model)
    # A PeftModel forwards ``generate`` to the model it wraps; its stubs do not declare it.
    generate = typing.cast(Callable[..., typing.Any], model.generate)
    with torch.no_grad():
        return generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
            **cache_argument(cache),
            **({} if processor is None else {"logits_processor": LogitsProcessorList([processor])}),
        )


def _cut_at_stop(
    new_tokens: torch.Tensor,
    stop_id: int,
    drawn: torch.Tensor | None,
    sampled_logps: list[torch.Tensor] | None,
) -> list[tuple[int, ...]]:
    """Each row's message: its new tokens up to and including the first ``stop_id`` (all of
    them where none was drawn); with ``sampled_logps``, each message's ``drawn`` log-probs are
    appended to it."""
    messages = []
    for row, tokens in enumerate(new_tokens.tolist()):
        cut = tokens.index(stop_id) + 1 if stop_id in tokens else len(tokens)
        messages.append(tuple(tokens[:cut]))
        if sampled_logps is not None:
            assert drawn is not None
            sampled_logps.append(drawn[row, :cut])
    return messages


def _draw_processor(
    temperature: float,
    draw: Draw,
    seeds: Sequence[int] | None,
    logps: list[torch.Tensor] | None,
) -> InverseCdfDraw | CoupledDraw | None:
    """The processor that draws each token (None: greedy, or ``generate``'s multinomial).
    "inverse_cdf" and coupled rows run ``generate`` greedily on scores whose argmax their
    processor drew, and record the log-probs themselves (``generate``'s scores are then
    one-hot)."""
    if temperature == 0:
        return None
    if seeds is not None:
        return CoupledDraw(temperature, seeds, logps)
    return None if draw == "multinomial" else InverseCdfDraw(temperature, logps)


def _left_padded(
    contexts: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The contexts as one left-padded batch (generation continues on the right) and its
    attention mask."""
    rows, width = len(contexts), max(len(c) for c in contexts)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    for row, context in enumerate(contexts):
        input_ids[row, width - len(context) :] = torch.tensor(context)
        attention[row, width - len(context) :] = 1
    return input_ids, attention


def _generation_config(
    chat: ChatFormat,
    max_new_tokens: int,
    sampling_temperature: float | None,
    record: bool,
    keeping: bool,
) -> GenerationConfig:
    """Pure sampling at ``sampling_temperature`` (no top-k, no top-p: the policy the updater
    trains), or greedy where it is None; the scores kept when the drawn log-probs are recorded,
    the dictionary output when they or the kept contexts are read."""
    sampling = sampling_temperature is not None
    return GenerationConfig(
        do_sample=sampling,
        temperature=sampling_temperature,
        top_k=0 if sampling else None,
        top_p=1.0 if sampling else None,
        max_new_tokens=max_new_tokens,
        eos_token_id=chat.stop_id,
        pad_token_id=chat.pad_id,
        output_scores=record and sampling,
        return_dict_in_generate=record or keeping,
    )


def _drawn_logps(
    output: typing.Any, processor: InverseCdfDraw | CoupledDraw | None, new_tokens: torch.Tensor
) -> torch.Tensor:
    """(rows, steps): the log-probability of each new token under the distribution it was
    drawn from, log softmax(logits / T)."""
    if processor is not None:
        assert processor.logps is not None
        return torch.stack(processor.logps, dim=1).cpu()
    # ``scores`` are the processed logits each token was drawn from: logits / T here (top-k 0
    # and top-p 1 add no other processor).
    return torch.stack(
        [
            torch.log_softmax(scores.float(), dim=-1).gather(-1, new_tokens[:, [step]])[:, 0]
            for step, scores in enumerate(output.scores)
        ],
        dim=1,
    ).cpu()


@dataclass
class _CachedLayout:
    """Inputs laid out as [left-padded cached part | left-padded rest], the cached part's keys
    and values, and each row's cached length."""

    input_ids: torch.Tensor
    attention: torch.Tensor
    cache: typing.Any
    cached: list[int]
    cached_width: int
    keepable: bool
    """Whether the cache is one plain key/value tensor pair per layer (``DynamicLayer``), so
    that rows of it can be kept for later calls."""

    def keep_contexts(
        self,
        contexts: Sequence[Sequence[int]],
        final_cache: typing.Any,
        caches: ContextCaches,
        key: SnapshotKey,
    ) -> None:
        """Keep every row's context: where its tokens lie in the cache generation left."""
        layers = _layer_tensors(final_cache)
        if layers is None or not caches.admits(layers):
            return
        cached_width = self.cached_width
        width = self.input_ids.shape[1]
        for row, context in enumerate(contexts):
            rest = len(context) - self.cached[row]
            positions = torch.cat(
                [
                    torch.arange(cached_width - self.cached[row], cached_width),
                    torch.arange(width - rest, width),
                ]
            )
            caches.keep(key, context, ContextSource(layers, row, positions))


def _layer_tensors(cache: typing.Any) -> LayerTensors | None:
    """Per layer (keys, values) of a cache of plain ``DynamicLayer``s; None for another kind
    (sliding windows, quantised or offloaded layers: their rows are not kept)."""
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return tuple((layer.keys, layer.values) for layer in layers)


def _cached_layout(
    model: torch.nn.Module,
    contexts: Sequence[Sequence[int]],
    chat: ChatFormat,
    prompt_lengths: Sequence[int],
    caches: ContextCaches | None = None,
    key: SnapshotKey | None = None,
) -> _CachedLayout:
    """Each row's longest prefix whose keys and values are known, as one cache.

    A row's cached part is the longest prefix of its context that ``caches`` holds for snapshot
    ``key`` (a context it read before), when longer than the prompt; otherwise its prompt but
    the last token (every row keeps at least one token to process), run here once per distinct
    prompt. The padding between the cached part and the rest is masked; positions follow the
    attention mask, so every real token sits at the position it has in its unpadded context,
    the one its kept keys were computed at.
    """
    rows = len(contexts)
    prompts = [tuple(c[: p - 1]) for c, p in zip(contexts, prompt_lengths, strict=True)]
    if min(len(p) for p in prompts) == 0:
        raise ValueError("prompt_lengths must be >= 2 (one-token prompts share nothing)")
    device = model_device(model)
    sources = _kept_sources(contexts, prompts, caches, key)
    missing = [row for row in range(rows) if sources[row] is None]
    if missing:
        distinct = list(dict.fromkeys(prompts[row] for row in missing))
        prompt_cache, prompt_width = _prompts_cache(model, distinct, chat.pad_id, device)
        prompt_layers = _layer_tensors(prompt_cache)
        if len(missing) == rows:
            # No kept row: one cache row per context from the prompts' own cache.
            group_of = [distinct.index(prompts[row]) for row in range(rows)]
            prompt_cache.reorder_cache(torch.tensor(group_of, device=device))
            return _finish_layout(
                contexts, prompts, chat, prompt_cache, prompt_width, prompt_layers is not None
            )
        # Kept rows exist only where earlier calls' caches were plain layers, as this one's is.
        assert prompt_layers is not None
        for row in missing:
            prompt = prompts[row]
            start = prompt_width - len(prompt)
            sources[row] = (
                prompt_layers,
                distinct.index(prompt),
                torch.arange(start, prompt_width),
            )
    ready = typing.cast(list[tuple[LayerTensors, int, torch.Tensor]], sources)
    return _assembled_layout(contexts, ready, set(missing), chat, device)


def _prompts_cache(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    pad_id: int,
    device: torch.device,
) -> tuple[typing.Any, int]:
    """One forward pass over ``prompts``, left-padded (positions follow the mask): its
    key/value cache, one row per prompt, and its width."""
    prefix_ids, prefix_mask = _left_padded(prompts, pad_id)
    with torch.no_grad():
        prompt_cache = cache_of(
            model(
                input_ids=prefix_ids.to(device),
                attention_mask=prefix_mask.to(device),
                position_ids=(prefix_mask.cumsum(-1) - 1).clamp(min=0).to(device),
                use_cache=True,
            )
        )
    return prompt_cache, prefix_ids.shape[1]


def _assembled_layout(
    contexts: Sequence[Sequence[int]],
    ready: Sequence[tuple[LayerTensors, int, torch.Tensor]],
    fresh: set[int],
    chat: ChatFormat,
    device: torch.device,
) -> _CachedLayout:
    """The layout over one cache gathered from every row's source (``ready``: where its cached
    part's keys and values lie); ``fresh``: the rows whose prompt this call ran."""
    cached_width = max(len(positions) for _, _, positions in ready)
    # Per row, the source positions of its cached part, right-aligned in ``cached_width``; the
    # padding slots repeat its first position (finite values that the mask hides).
    index = torch.stack(
        [
            torch.cat([positions[:1].expand(cached_width - len(positions)), positions])
            for _, _, positions in ready
        ]
    ).to(device)
    assembled = _gathered_layers(ready, index, device)
    cached_prefixes = [tuple(contexts[r][: len(p)]) for r, (_, _, p) in enumerate(ready)]
    profiling.count(
        "kept context positions", sum(len(p) for r, (_, _, p) in enumerate(ready) if r not in fresh)
    )
    return _finish_layout(
        contexts, cached_prefixes, chat, DynamicCache(assembled), cached_width, True
    )


def _kept_sources(
    contexts: Sequence[Sequence[int]],
    prompts: Sequence[tuple[int, ...]],
    caches: ContextCaches | None,
    key: SnapshotKey | None,
) -> list[tuple[LayerTensors, int, torch.Tensor] | None]:
    """Per row, where its longest kept prefix lies (layers, row, positions), where that prefix
    is longer than its prompt; None where the prompt is to be run."""
    sources: list[tuple[LayerTensors, int, torch.Tensor] | None] = [None] * len(contexts)
    if caches is not None and key is not None:
        for row, context in enumerate(contexts):
            length, source = caches.longest(key, context)
            if source is not None and length > len(prompts[row]):
                sources[row] = (source.layers, source.row, source.positions[:length])
    return sources


def _gathered_layers(
    ready: Sequence[tuple[LayerTensors, int, torch.Tensor]],
    index: torch.Tensor,
    device: torch.device,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values for every row, gathered from the row's source at the
    positions ``index`` holds (one gather per distinct source)."""
    rows, cached_width = index.shape
    by_source: dict[int, list[int]] = {}
    for row, (layers, _, _) in enumerate(ready):
        by_source.setdefault(id(layers), []).append(row)
    assembled = []
    for layer in range(len(ready[0][0])):
        pair = []
        for part in (0, 1):
            sample = ready[0][0][layer][part]
            out = sample.new_empty((rows, sample.shape[1], cached_width, sample.shape[3]))
            for members in by_source.values():
                layers = ready[members[0]][0]
                source_rows = torch.tensor([ready[r][1] for r in members], device=device)
                # (rows, width) advanced indices around a slice: (rows, width, heads, dim)
                gathered = layers[layer][part][source_rows[:, None], :, index[members], :]
                out[members] = gathered.permute(0, 2, 1, 3)
            pair.append(out)
        assembled.append((pair[0], pair[1]))
    return assembled


def _finish_layout(
    contexts: Sequence[Sequence[int]],
    cached_prefixes: Sequence[Sequence[int]],
    chat: ChatFormat,
    cache: typing.Any,
    cached_width: int,
    keepable: bool,
) -> _CachedLayout:
    """The [left-padded cached part | left-padded rest] inputs for a cache of ``cached_width``
    positions whose row r holds ``cached_prefixes[r]`` right-aligned."""
    rows = len(contexts)
    cached = [len(p) for p in cached_prefixes]
    rest_width = max(len(c) - n for c, n in zip(contexts, cached, strict=True))
    input_ids = torch.full((rows, cached_width + rest_width), chat.pad_id, dtype=torch.long)
    attention = torch.zeros((rows, cached_width + rest_width), dtype=torch.long)
    for row, (context, prefix) in enumerate(zip(contexts, cached_prefixes, strict=True)):
        if prefix:
            input_ids[row, cached_width - len(prefix) : cached_width] = torch.tensor(prefix)
            attention[row, cached_width - len(prefix) : cached_width] = 1
        rest = context[len(prefix) :]
        input_ids[row, input_ids.shape[1] - len(rest) :] = torch.tensor(rest, dtype=torch.long)
        attention[row, attention.shape[1] - len(rest) :] = 1
    return _CachedLayout(input_ids, attention, cache, cached, cached_width, keepable)
