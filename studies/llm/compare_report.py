"""Summarise an equal-budget comparison of training runs: one JSON and one figure.

Reads each run directory (``config.json``, ``metrics.jsonl``) and the ``teamtr eval`` result of
the trained and the untrained team, and writes ``{"runs": {name: {...}}}`` with held-out
accuracy and its binomial standard error, stages trained, the per-stage training reward and
the KL of every update, and the time used on the run's budget clock. The figure shows the
training reward per stage against the budget clock (left) and held-out accuracy with ±1 s.e.
bars against the untrained team (right).

Usage (``python -m studies.llm.compare_report`` takes the same options)::

    teamtr compare-report --out results/llm_compare.json --plot figures/llm_compare.png \\
        --run teamtr=runs/compare/teamtr:teamtr_eval.json:untrained_team.json ...

Each ``--run`` is ``NAME=RUN_DIR[:TRAINED_EVAL.json[:UNTRAINED_EVAL.json]]``; ``-`` as the
trained evaluation, or none, takes the one the run made itself when it ended (the ``eval`` of
its last line in ``metrics.jsonl``); without an untrained evaluation the summary's
``untrained`` is null and the figure has no bar for it. A wrong argument, or a file that cannot
be read, is one line and exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies import options
from studies.llm.run_records import RunSpec, summarise

PROG = "teamtr compare-report"


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run",
        type=RunSpec.parse,
        action="append",
        required=True,
        help="NAME=RUN_DIR[:TRAINED_EVAL.json[:UNTRAINED_EVAL.json]] ('-' or none: the run's "
        "own last eval; the untrained one is optional)",
    )
    parser.add_argument("--out", type=Path, required=True, help="summary JSON")
    options.add_plot(parser, "figure (PNG)")
    parser.add_argument("--setup", default="", help="one line describing the comparison")
    return parser


def run(args: argparse.Namespace) -> int:
    problem = options.first_problem(
        *(spec.problem() for spec in args.run),
        options.output_problem(args.out, "--out"),
        options.output_problem(args.plot, "--plot"),
    )
    if problem is not None:
        return options.refuse(PROG, problem)
    summary = {"setup": args.setup, "runs": {spec.name: summarise(spec) for spec in args.run}}
    options.prepared(args.out).write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.out}")
    if args.plot is not None:
        from studies.llm.compare_report_plot import plot  # matplotlib only when drawing

        print(f"wrote {plot(summary, args.plot)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m studies.llm.compare_report``: the same as ``teamtr compare-report``."""
    return run(build_parser("python -m studies.llm.compare_report").parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
