"""What a stage prints on the console besides its progress bar: its certificate's two parts,
its environment's part, its periodic held-out result, the warning of a stage that learned
nothing, and the count of messages cut at their length limit behind that warning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from llm.training.stages.records import StageMetrics
from teamtr.reports import StageReport


def environment_part(record: StageMetrics) -> str:
    """A stage line's account of its environment, where it has one: the texts it added and the
    dialogues it ended."""
    if not record.environment_texts:
        return ""
    return (
        f" (environment: {record.environment_texts} texts, "
        f"{record.ended_by_environment} dialogues ended)"
    )


def messages_cut(episodes: Sequence[Any], sampler: Any) -> tuple[int, int]:
    """Of the messages of ``episodes``, those cut at their speaker's ``max_new_tokens``, and
    all: a cut message fills its limit without the stop token, which one that ended on its
    own carries as its last token (``llm.engines.hf.messages``)."""
    stop = sampler.chat.stop_id
    turns = [turn for episode in episodes for turn in episode.turns]
    cut = sum(
        len(t.message) >= sampler.settings.max_tokens_of(t.agent) and t.message[-1] != stop
        for t in turns
    )
    return cut, len(turns)


def no_signal_warning(label: str, record: StageMetrics, cut_messages: tuple[int, int]) -> str:
    """The line of a stage whose groups all earned equal rewards: GRPO's advantages were all
    zero, so no agent moved, and nothing says so but ``groups_with_signal: 0``."""
    cut, messages = cut_messages
    reward = record.train_reward if record.train_reward is not None else math.nan
    return (
        f"warning: {label}: none of the {record.groups_drawn} groups drawn had differing "
        f"rewards (mean reward {reward:.2f}), so this stage learned nothing. Usual causes: "
        f"a reward that never varies; messages cut by [sampler] max_new_tokens ({cut} of "
        f"{messages} reached it); a task too hard (or too easy) for the model. "
        "`teamtr train --check --real` plays a few dialogues of the real model and counts "
        "the groups that would carry a signal"
    )


def held_out_line(evaluation: dict[str, float]) -> str:
    """The held-out result of a periodic evaluation, as the console prints it."""
    measure = "accuracy" if "accuracy" in evaluation else "score"
    return (
        f"held-out {measure} {evaluation[measure]:.3f} +- "
        f"{evaluation['standard_error']:.3f} on {int(evaluation['n'])} problems, parse "
        f"failures {evaluation['parse_failure_rate']:.2f}"
    )


def certificate_parts(report: StageReport) -> str:
    """The certificate's two parts, surrogate gain L and penalty (Thm 3.4/3.6: certificate
    = L - penalty), and, when negative, why it certifies nothing (docs/runs.md)."""
    kept = [r for r in report.records if r.kept]
    if not kept:
        undone = sum(r.undone for r in report.records)
        return (
            f" (no update kept; {undone} undone: measured bound < 0)"
            if undone
            else " (no update kept)"
        )
    gain = sum(r.update.surrogate for r in kept)
    penalty = gain - report.certificate  # joint schemes charge one penalty for the whole move
    text = f"surrogate gain {gain:.3g} - penalty {penalty:.3g}"
    if report.certificate < 0:
        # Both parts grow as sqrt(KL) to first order: a smaller radius rarely changes the sign.
        text += "; negative: it certifies no improvement, see docs/runs.md"
    if report.measured is not None:  # [stage] certificate_groups: held-out pairs (teamtr.measured)
        text += f"; measured: {report.measured.line()}"
    return f" ({text})"
