"""The agent runner: multi-turn episodes against SGLang and the eval server, written into the
store (`agent_runner.py`), its settings read once from the recipe and the flags (`config.py`),
its /stats counters and Prometheus text (`metrics.py`), its scheduler (`scheduler.py`: epochs,
seeded shuffle, resume) and the level curriculum (`curriculum.py`).

May import: buffer_server.store, slime_ext.rollout, slime_ext.clients, slime_ext.trajectory, slime_ext.cluster,
krl_common.
"""
