"""Rollout buffer service: the durable trajectory store with GRPO group hand-out (`store/`), the
agent runner that drives episodes against SGLang and the eval server and writes them into the
store (`runner/`), the HTTP handlers (`api/`), the Flask app that registers them (`app.py`) and
the CLI (`__main__.py`). The record format is `slime_ext.trajectory.record.TrajectoryRecord`;
see docs/BUFFER_SERVER.md.

May import: slime_ext, krl_common.
"""
