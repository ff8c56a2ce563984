"""TEST DOUBLE of slime/observability/metric_utils.compute_rollout_step (same rule)."""

from __future__ import annotations


def compute_rollout_step(args, rollout_id):
    if getattr(args, "wandb_always_use_train_step", False):
        return rollout_id * args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
    return rollout_id
