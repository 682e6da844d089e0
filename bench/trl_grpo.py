"""What the two TRL benchmarks (``peer_grpo_step.py``, ``peer_grpo_task.py``) hand TRL alike:
the model, made trainable by TRL's Trainer, and a ``GRPOConfig`` with teamtr's settings.

Imported only under ``.venv-peers`` (``make peers``), where TRL is installed.
"""

from __future__ import annotations

from typing import Any

from llm.common.config import RunConfig


def trainable_by_trl(model: Any) -> Any:
    """``model`` without its quantizer label: the GGUF file is dequantized to float32 at load,
    but transformers keeps its quantizer attached and its Trainer refuses to train a
    GGUF-"quantized" model."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def grpo_config(config: RunConfig, output_dir: str, seed: int, **shape: Any) -> Any:
    """TRL's ``GRPOConfig`` with teamtr's sampler and updater settings where GRPO has them (its
    group, message length, temperature without top-p/top-k, learning rate, clip, no KL term,
    one iteration a batch) and on a CPU; ``shape``: the batch, the steps and anything else a
    benchmark sets itself."""
    from trl import GRPOConfig

    s = config.sampler
    return GRPOConfig(
        output_dir=output_dir,
        num_generations=s.group_size,
        max_completion_length=s.longest_message,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=config.updater.learning_rate,
        lr_scheduler_type="constant",
        epsilon=config.updater.clip_eps,
        beta=0.0,
        num_iterations=1,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=seed,
        **shape,
    )
