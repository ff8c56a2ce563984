"""Data preparation: KernelBench problems -> RL prompt records with a recorded train/holdout split
(`kernelbench.py`, `split.py`), KernelBook -> slime SFT examples (`kernelbook.py`, `sft_format.py`,
`sft_build.py`). The command-line tools in `tools/prepare_*.py` are thin layers over these modules;
docs/DATA.md describes every file format they write.

May import: slime_ext.rollout, slime_ext.clients, eval_server.schema, eval_server.checks,
eval_server.samples, krl_common.
"""
