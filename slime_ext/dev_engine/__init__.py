"""The dry run's stand-in for SGLang: a tiny Qwen3-architecture model with random weights
(`tiny_model.py`), the embedded engine that serves it over SGLang's `/generate` protocol
(`engine.py`, run as `python -m slime_ext.dev_engine.engine`) and its scripted answers
(`scripted.py`); and random checkpoints of real architectures' shapes with the same tokenizer
(`random_checkpoint.py`, `python -m tools.build_random_checkpoint`).

May import: slime_ext.rollout, slime_ext.convert, eval_server.samples, krl_common.
"""
