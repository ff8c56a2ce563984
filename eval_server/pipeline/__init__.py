"""One evaluation in a child process, phase by phase (`evaluate.py` reads as the list of phases):
loading the reference and candidate (`loader.py`, `cuda_backend.py` for CUDA builds), the
reference timing cache (`ref_cache.py`) and GPU timing (`timing.py`).

May import: eval_server.checks, eval_server.isolation, eval_server.schema, eval_server.feedback.
"""
