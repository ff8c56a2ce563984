"""Model evaluation reports: per-sample results (`results.py`), metrics (`metrics.py`), the
evaluation run (`runner.py`) with its two policy backends (SGLang `/generate` through the episode,
and an OpenAI-compatible chat endpoint, `chat_policy.py`), the JSON/markdown report (`report.py`),
plots (`plots.py`) and the paired comparison of two runs (`compare.py`).
See docs/EVAL_REPORTS.md.

May import: slime_ext.rollout, slime_ext.clients, slime_ext.trajectory, eval_server.schema, krl_common.
"""
