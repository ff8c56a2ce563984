"""The judge: the process that decides the verdict and never runs candidate code.

Forked by the worker (workers/worker.py) for each evaluation, it forks the candidate's runner
(eval_server/runner) before either touches CUDA, owns the reference, the inputs (fresh values
from a secret of its own for every call), the timing events on its own stream, a snapshot of
every output the runner produces and their comparison, and builds the result it serialises.
What the runner reports is the first layer of checks: it can make a verdict worse, never better.

May import: eval_server.pipeline, eval_server.checks, eval_server.schema, eval_server.feedback,
eval_server.gpu_ipc, eval_server.wire.
"""
