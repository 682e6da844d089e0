"""Settings every test shares.

``dtype = "auto"`` picks bfloat16 on a CPU with AMX and float32 on other CPUs
(``llm.common.devices.auto_dtype``). The tests' expected values, tolerances and bit-for-bit
comparisons are those of a run on any CPU, so every test, and every ``teamtr`` a test starts
(it inherits the environment), sees float32 there; the tests of the choice itself lift the pin
(``tests/llm/test_llm_auto_dtype.py``).

Under ``pytest -n N`` (pytest-xdist, as ``make test`` runs the suite: one worker per core) each
worker, and every process a test starts, computes on one torch thread: N workers with torch's
default of one thread per core would run N times as many threads as there are cores. A file
that builds something once for its tests (a module-scoped fixture: a trained run, a server, a
wheel) keeps its tests on one worker, so that it is built once; every other test goes to
whichever worker is free (``--dist loadgroup``, scheduled by ``work_unit`` below). The vLLM
engine's test files go first, the longest first, since together they take longest: each file
on one worker, so that at most one server a worker runs at a time (a server holds 2-3 GB; an
idle one takes no CPU, and a busy one the thread it inherits).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

CPU_AUTO_DTYPE_VARIABLE = "TEAMTR_CPU_AUTO_DTYPE"
"""``llm.common.devices.CPU_AUTO_DTYPE_VARIABLE``, spelled out so that the core's tests do not
import torch (``tests/llm/test_llm_auto_dtype.py`` checks that the two agree)."""

os.environ[CPU_AUTO_DTYPE_VARIABLE] = "float32"

# No test loads anything from the Hugging Face hub (the models are built or shipped locally),
# and a name that is not cached must fail at once: online, huggingface_hub retries an
# unreachable hub five times with backoff (about 23 s) before transformers gives up. Set before
# any test module imports huggingface_hub, which reads them once; every process a test starts
# inherits them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
"""This process's pytest-xdist worker ("gw0", ...), or None without ``-n``."""
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # imported before this file (a plugin): the variable came late
        sys.modules["torch"].set_num_threads(1)

VLLM_ENGINE_TESTS = (
    "tests/llm/test_llm_engine_vllm_lifecycle.py",
    "tests/llm/test_llm_engine_lora_sum.py",
    "tests/llm/test_llm_engine_vllm.py",
    "tests/llm/test_llm_export_vllm.py",
)
"""The test files that start vLLM servers (skipped without ``.venv-vllm``), longest first: the
order in which they start."""

BUILT_ONCE = re.compile(r"@pytest\.fixture\([^)]*scope\s*=\s*[\"'](module|package|session)[\"']")
"""A fixture that a test file builds once for its tests."""


def work_unit(nodeid: str, root: Path) -> str:
    """The tests that one worker runs together, named: the tests of a vLLM engine's test file
    or of a file that builds a fixture once, and every other test on its own."""
    group = nodeid.rpartition("@")[2] if nodeid.rfind("@") > nodeid.rfind("]") else None
    if group:  # pytest.mark.xdist_group, where pytest-xdist can see it
        return group
    path = nodeid.partition("::")[0]
    if path in VLLM_ENGINE_TESTS or _builds_once(root / path):
        return path
    return nodeid


@functools.cache
def _builds_once(path: Path) -> bool:
    try:
        return BUILT_ONCE.search(path.read_text(encoding="utf-8")) is not None
    except OSError:
        return False


def _start_rank(unit: str) -> int:
    """Where a unit starts: the vLLM engine's files in their order, then every other unit."""
    return VLLM_ENGINE_TESTS.index(unit) if unit in VLLM_ENGINE_TESTS else len(VLLM_ENGINE_TESTS)


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        """``--dist loadgroup`` by ``work_unit``, the vLLM engine's test files first (longest
        first), then the files that build a fixture once (most tests first), then single tests
        in collection order.

        pytest-xdist 3.8 marks an ``xdist_group`` test by appending ``@group`` to
        ``item._nodeid``, which pytest 9.2's nodeid (``item._id``) no longer reads: its
        loadgroup then schedules every test on its own. The units here come from the nodeid's
        file instead."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid, self.config.rootpath)

        def schedule(self) -> None:
            """``LoadScopeScheduling.schedule`` (pytest-xdist 3.8) with the units in this order."""
            assert self.collection_is_completed
            if self.collection is not None:
                for node in self.nodes:
                    self._reschedule(node)
                return
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = list(next(iter(self.registered_collections.values())))
            if not self.collection:
                return
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            for unit, nodeids in sorted(
                units.items(), key=lambda item: (_start_rank(item[0]), -len(item[1]))
            ):
                self.workqueue[unit] = nodeids
            for _ in range(len(self.nodes) - len(self.workqueue)):
                unused, _assigned = self.assigned_work.popitem()
                unused.shutdown()
            for node in self.nodes:
                self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)
            if not self.workqueue:
                for node in self.nodes:
                    node.shutdown()

    def pytest_xdist_make_scheduler(config: pytest.Config, log):
        """The scheduler of ``--dist loadgroup`` (as ``make test`` runs the suite)."""
        if config.getoption("dist") == "loadgroup":
            return WorkUnitScheduling(config, log)
        return None
