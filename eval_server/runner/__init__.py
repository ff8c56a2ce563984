"""The candidate's process: everything here runs where candidate code runs, and is untrusted.

The runner is forked by the judge (before either initialises CUDA). It first serves the
reference's timed calls (before any candidate code exists in it), then runs the first layer of
checks on the candidate (static rules, the audit hook, the CUDA build, correctness trials under
the launch/op/thread recorders and CUPTI: `pipeline/`, `checks/`), reports what they found, and
serves the candidate's calls. What it reports can only make the verdict worse: the judge decides
correctness and speed from outputs it snapshots itself. Nothing here imports `eval_server.judge`.

May import: eval_server.pipeline, eval_server.checks, eval_server.gpu_ipc, eval_server.wire.
"""
