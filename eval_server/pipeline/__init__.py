"""The first layer: one evaluation's checks in the candidate's process, phase by phase (`evaluate.py`
reads as the list of phases; the judge, eval_server/judge, times and decides):
what the phases share (`context.py`: the evaluation's context, the reference as its phase leaves it,
the launch/thread recorders) and how they end an evaluation early (`verdicts.py`); the phases
themselves: the candidate's static checks, CUDA build, loading and running (`candidate.py`), the
reference (`reference.py`) and correctness (`verification.py`); and what they use: loading the
reference and candidate (`loader.py`, `cuda_backend.py` for CUDA builds), the reference cache
(`ref_cache.py`: the judge's timings, the reference's facts); `timing.py` holds the timing
primitives and statistics the judge's timing uses.

May import: eval_server.checks, eval_server.isolation, eval_server.schema, eval_server.feedback.
"""
