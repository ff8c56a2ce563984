"""Supervised fine-tuning without Megatron: LoRA / QLoRA on one GPU with transformers + PEFT
(`lora.py`), on the SFT jsonl of slime_ext/data with slime's assistant-turn loss mask
(`masking.py`); `tools/sft_lora.py` is the command line (docs/SFT_LORA.md).

May import: slime_ext.data, krl_common.
"""
