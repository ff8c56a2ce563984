"""One evaluation in a child process, phase by phase (`evaluate.py` reads as the list of phases):
what the phases share (`context.py`: the evaluation's context, the reference as its phase leaves it,
the launch/thread recorders) and how they end an evaluation early (`verdicts.py`); the phases
themselves: the candidate's static checks, CUDA build, loading and running (`candidate.py`), the
reference (`reference.py`), correctness (`verification.py`) and timing (`timing_phase.py`); and
what they use: loading the reference and candidate (`loader.py`, `cuda_backend.py` for CUDA
builds), the reference timing cache (`ref_cache.py`) and GPU timing (`timing.py`).

May import: eval_server.checks, eval_server.isolation, eval_server.schema, eval_server.feedback.
"""
