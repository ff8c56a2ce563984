"""Rollout buffer service: durable trajectory store (SQLite, WAL, synchronous=FULL), GRPO group
hand-out to the trainer (whole groups, two-phase lease / ack), and its HTTP app.

- `store.py`: BufferStore (idempotent writes by uid, group rules, leases, persistent counters);
- `app.py`: the Flask app (validation, routes, Prometheus metrics);
- `__main__.py`: `python -m buffer_server` (waitress, loopback, port 8889 by default);
- `runner.py`: the agent runner (multi-turn episodes against SGLang and the eval server, written
  into the store; `POST /rollout/start`, `/rollout/stop`), with `scheduler.py` (epochs, seeded
  shuffle, resume) and `curriculum.py` (the level sampler).

The record format is `slime_ext.trajectory.TrajectoryRecord`; see docs/BUFFER_SERVER.md.
"""
