"""Where earlier imports find the base-folder writer, now ``llm.models.base_folder``."""

from llm.models.base_folder import base_folder, weights_digest, write_plain_base

__all__ = ["base_folder", "weights_digest", "write_plain_base"]
