"""slime plug-ins of the kernel RL recipe (dotted paths for slime's `--*-path` flags).

| slime flag | dotted path |
|---|---|
| `--rollout-function-path` (buffer mode) | `slime_ext.slime_plugins.rollout.generate_rollout` |
| `--custom-generate-function-path` (in-slime mode) | `slime_ext.slime_plugins.generate.generate` |
| `--custom-rm-path` (in-slime mode) | `slime_ext.slime_plugins.generate.reward` |
| `--custom-reward-post-process-path` | `slime_ext.slime_plugins.reward_post.post_process` |
| `--custom-rollout-log-function-path` | `slime_ext.slime_plugins.rollout_log.log_rollout` |
| `--custom-eval-rollout-log-function-path` | `slime_ext.slime_plugins.rollout_log.log_eval_rollout` |

Settings: `--custom-config-path` with the recipe YAML (`kernel_rl.episode`, `kernel_rl.plugins`).
slime is imported lazily (only `slime_api.py` imports it), so every module here imports without
slime. The checkpoint converter (slime_ext.convert) serves a resumed run's engine reload
(`resume_weights.py`). See docs/SLIME_PLUGINS.md.

May import: slime_ext.rollout, slime_ext.clients, slime_ext.trajectory, slime_ext.convert, eval_server.schema,
krl_common.
"""
