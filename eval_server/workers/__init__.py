"""Process management: the supervised pool of per-device workers with its bounded queue
(`pool.py`), the warm worker that forks a fresh child per evaluation (`worker.py`), the spare
child's preparation ahead of its evaluation (`child_prep.py`, `triton_warmup.py`).

May import: eval_server.pipeline, eval_server.checks, eval_server.isolation, eval_server.schema,
eval_server.feedback, eval_server.judge, eval_server.runner, krl_common.
"""
