"""Supervised fine-tuning without Megatron: LoRA / QLoRA on one GPU (transformers + PEFT)."""
