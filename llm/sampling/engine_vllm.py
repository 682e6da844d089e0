"""Where earlier imports find the vLLM engine's parts, now in ``llm.engines.vllm`` (and the
adapter writer in ``llm.models.adapter_folder``)."""

from llm.engines.vllm.command import vllm_rank
from llm.engines.vllm.server import vllm_python
from llm.models.adapter_folder import write_adapter

__all__ = ["vllm_python", "vllm_rank", "write_adapter"]
