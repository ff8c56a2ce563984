"""The HTTP API of the buffer service, one module per concern: the state every handler reads
(`context.py`), reading and validating request bodies (`bodies.py`), the error replies
(`errors.py`), the writes (`trajectories.py`), the batch hand-out (`batches.py`), the
trainer's controls (`control.py`), health and stats (`status.py`) and the Prometheus text
(`metrics.py`). `buffer_server/app.py` registers them on one Flask app.

May import: buffer_server.store, buffer_server.runner, slime_ext.trajectory, krl_common.
"""
