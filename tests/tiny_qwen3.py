"""Re-export of the tiny Qwen3 model and local tokenizer for tests (the logic lives in product
code, `slime_ext/dev_engine/tiny_model.py`, also used by the CPU dry run)."""

from __future__ import annotations

from slime_ext.dev_engine.tiny_model import SPECIAL_TOKENS, TEMPLATE, tiny_model, tiny_tokenizer

__all__ = ["SPECIAL_TOKENS", "TEMPLATE", "tiny_model", "tiny_tokenizer"]
