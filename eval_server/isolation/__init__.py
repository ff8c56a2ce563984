"""What keeps one evaluation from reaching the server or another evaluation: process hygiene
(`sandbox.py`: scrubbed environment, limits, process groups), the evaluation child's audit hook
(`audit.py`: what candidate code may not call, however it reaches it), the hardening settings
(`hardening.py`) and the per-GPU timing lock (`gpu_lock.py`).

May import: nothing of this project.
"""
