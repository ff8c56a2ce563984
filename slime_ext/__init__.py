"""RL-side library of the Triton-kernel recipe.

slime_ext holds everything that runs on the training side of the boundary with the evaluation
service: the problem sets, the prompts, the multi-turn episode (generate a kernel, have it
evaluated, feed the result back), the rewards computed from evaluation results, the plug-ins that
slime loads (rollout and reward functions), checkpoint conversion and data preparation. It talks
to the evaluation service only over HTTP (see `slime_ext.eval_client`) and shares nothing with it
but the request/response schema in `eval_server.schema`.
"""
