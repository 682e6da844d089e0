"""Settings every test shares.

``dtype = "auto"`` picks bfloat16 on a CPU with AMX and float32 on other CPUs
(``llm.common.devices.auto_dtype``). The tests' expected values, tolerances and bit-for-bit
comparisons are those of a run on any CPU, so every test, and every ``teamtr`` a test starts
(it inherits the environment), sees float32 there; the tests of the choice itself lift the pin
(``tests/llm/test_llm_auto_dtype.py``).
"""

from __future__ import annotations

import os

CPU_AUTO_DTYPE_VARIABLE = "TEAMTR_CPU_AUTO_DTYPE"
"""``llm.common.devices.CPU_AUTO_DTYPE_VARIABLE``, spelled out so that the core's tests do not
import torch (``tests/llm/test_llm_auto_dtype.py`` checks that the two agree)."""

os.environ[CPU_AUTO_DTYPE_VARIABLE] = "float32"
