"""Parameter names of every plug-in, as slime names them at its call sites and in its plug-in
contract tests (THUDM/slime @ 624b824a: `tests/plugin_contracts/*`, which compare names exactly).
This pins them where slime's source is absent (CI); tests/integration/test_real_slime_hooks.py
checks them against slime's own contract tests when the source is present."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from slime_ext.slime_plugins.generate import generate, reward
from slime_ext.slime_plugins.reward_post import post_process
from slime_ext.slime_plugins.rollout import generate_rollout
from slime_ext.slime_plugins.rollout_log import log_eval_rollout, log_rollout

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("fn", "names"),
    [
        # slime/rollout/sglang_rollout.py generate_rollout (default --rollout-function-path)
        (generate_rollout, ("args", "rollout_id", "data_source", "evaluation")),
        # generate_and_rm: fn(args, sample, sampling_params[, evaluation=...])
        (generate, ("args", "sample", "sampling_params", "evaluation")),
        # rm_hub.async_rm: rm(args, sample, **kwargs)
        (reward, ("args", "sample", "kwargs")),
        # RolloutManager._post_process_rewards: fn(self.args, samples)
        (post_process, ("args", "samples")),
        # rollout_metrics.log_rollout_data / log_eval_rollout_data
        (log_rollout, ("rollout_id", "args", "samples", "rollout_extra_metrics", "rollout_time")),
        (log_eval_rollout, ("rollout_id", "args", "data", "extra_metrics")),
    ],
)
def test_parameter_names_are_slimes(fn: Callable[..., object], names: tuple[str, ...]) -> None:
    assert tuple(inspect.signature(fn).parameters) == names
    params = inspect.signature(fn).parameters
    if "evaluation" in params:
        assert params["evaluation"].default is False
