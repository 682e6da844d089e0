"""Reading a config loads no torch: every settings dataclass lives in ``llm.common.settings``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "peft", "transformers")
DEFAULT = Path(__file__).resolve().parents[2] / "configs" / "default.toml"


def test_reading_and_checking_a_config_imports_no_torch():
    code = (
        "import sys\n"
        "from llm.common.config import load_config\n"
        f"config = load_config({str(DEFAULT)!r})\n"
        "assert config.sampler.turns == 2 and config.lora.rank == 16\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_components_use_the_same_settings_classes():
    from llm.common import settings
    from llm.models import agents
    from llm.sampling import sampler
    from llm.update import updater

    assert agents.LoraSettings is settings.LoraSettings
    assert sampler.SamplerSettings is settings.SamplerSettings
    assert updater.UpdaterSettings is settings.UpdaterSettings
    # peft is imported when a LoRA config is made, not when the settings are read.
    assert settings.LoraSettings(rank=4).peft_config().r == 4
