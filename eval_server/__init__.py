"""Kernel evaluation service: load, check, run and time candidates (Triton or CUDA) against
KernelBench references. It stands alone: the RL side talks to it over HTTP only.

The data flow, top to bottom: `app.py` (HTTP) and `__main__.py` (CLI) -> `workers/` (the pool of
per-device workers, each forking a fresh child per evaluation) -> `pipeline/` (one evaluation,
phase by phase) -> `checks/` (static rules, runtime checks, comparison) and `isolation/` (process
sandbox, hardening settings, the GPU lock). `schema.py` is the one definition of the request /
result JSON and `feedback.py` the text shown to the model; `samples/` the bundled corpus,
`launch.py` starts a server for tools and tests. See docs/EVAL_SERVER.md.

May import: krl_common.
"""
