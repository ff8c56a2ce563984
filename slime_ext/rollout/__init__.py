"""One multi-turn episode and what it is made of: the prompt record (`problems.py`), prompts
(`prompts.py`), chat rendering with token deltas (`chat.py`), candidate extraction
(`candidate.py`), rewards and returns (`rewards.py`), the episode itself (`episode.py`) and the
recipe YAML that configures it (`recipe.py`).

May import: slime_ext.clients, slime_ext.trajectory, eval_server.schema, krl_common.
"""
