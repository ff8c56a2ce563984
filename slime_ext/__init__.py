"""RL-side library of the kernel recipe: everything on the training side of the boundary with
the evaluation service, which it reaches over HTTP only (it imports `eval_server.schema` for the
wire format, `eval_server.checks` for data filtering and `eval_server.samples` for the dry run).

- `clients/`: the eval-server and SGLang clients, the kernel backends;
- `rollout/`: prompt records, prompts, chat rendering, candidate extraction, rewards, the episode,
  the recipe;
- `trajectory/`: the trajectory record and its packed codec;
- `slime_plugins/`: what slime loads (dotted paths unchanged); `data/`: data preparation;
  `reports/`: evaluation reports; `convert/`: checkpoint conversion;
- `dev_engine/`: the dry run's tiny model, its embedded `/generate` engine and scripted answers
  (`tiny_engine.py` and `tiny_model.py` at the top keep the old `python -m` paths working).

May import: krl_common, eval_server.schema, eval_server.checks, eval_server.samples.
"""
