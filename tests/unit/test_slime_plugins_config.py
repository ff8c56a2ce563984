"""Plug-in settings from `args.kernel_rl` (slime_ext/slime_plugins/config.py), the example recipe,
and the argument checks of the in-slime generate / rm that need no server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.slime_double import install

install()

from slime.utils.types import Sample  # noqa: E402

from krl_common.validation import ValidationError  # noqa: E402
from slime_ext.rollout.recipe import load_recipe  # noqa: E402
from slime_ext.slime_plugins.config import (  # noqa: E402
    DEFAULT_BUFFER_URL,
    ENV_BUFFER_URL,
    ENV_EVAL_URLS,
    episode_config,
    plugin_config,
)
from slime_ext.slime_plugins.generate import generate, reward  # noqa: E402
from slime_ext.slime_plugins.resources import max_context_len, router_url, sampling_extras  # noqa: E402

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "recipe" / "kernelbench_multiturn.yaml"


def test_defaults_and_env(monkeypatch) -> None:
    monkeypatch.delenv(ENV_BUFFER_URL, raising=False)
    monkeypatch.delenv(ENV_EVAL_URLS, raising=False)
    cfg = plugin_config(SimpleNamespace())
    assert cfg.resolved_buffer_url == DEFAULT_BUFFER_URL and cfg.start_runner
    assert cfg.resolved_eval_urls == ["http://127.0.0.1:18188"]
    monkeypatch.setenv(ENV_BUFFER_URL, "10.0.0.2:9000/")
    monkeypatch.setenv(ENV_EVAL_URLS, "h1:1, h2:2")
    cfg = plugin_config(SimpleNamespace(kernel_rl={"plugins": None}))
    assert cfg.resolved_buffer_url == "http://10.0.0.2:9000"
    assert cfg.resolved_eval_urls == ["http://h1:1", "http://h2:2"]
    cfg = plugin_config(SimpleNamespace(kernel_rl={"plugins": {"eval_urls": "a:1,b:2", "buffer_url": "x:1"}}))
    assert cfg.resolved_eval_urls == ["http://a:1", "http://b:2"] and cfg.resolved_buffer_url == "http://x:1"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"buffer_urls": "x"}, r"kernel_rl\.plugins: unknown field"),
        ({"start_runner": "yes"}, r"kernel_rl\.plugins\.start_runner: expected bool"),
        ({"batch_wait_s": True}, r"kernel_rl\.plugins\.batch_wait_s: expected int or float, got bool"),
        ({"max_wait_s": 0}, "max_wait_s must be > 0"),
        ({"policy_version_lag": -1}, "policy_version_lag must be >= 0"),
        ({"eval": {"n_samples": 2}}, r"kernel_rl\.plugins\.eval: unknown field"),
        ({"eval": {"concurrency": 0}}, r"kernel_rl\.plugins\.eval: .*concurrency must be >= 1"),
        ({"eval_urls": 5}, r"kernel_rl\.plugins\.eval_urls: expected list"),
    ],
)
def test_errors_name_the_key(section, message) -> None:
    with pytest.raises(ValidationError, match=message):
        plugin_config(SimpleNamespace(kernel_rl={"plugins": section}))


def test_example_recipe_parses() -> None:
    recipe = load_recipe(EXAMPLE)
    args = SimpleNamespace(kernel_rl=recipe)
    cfg = plugin_config(args)
    assert cfg.eval.prompt_data and cfg.policy_version_lag == 0
    assert episode_config(args).max_turns == 3


def test_sampling_settings_from_args() -> None:
    args = SimpleNamespace(rollout_top_p=1.0, rollout_top_k=20, rollout_stop=None, rollout_stop_token_ids=[7])
    assert sampling_extras(args) == {"top_k": 20, "stop_token_ids": [7]}
    with pytest.raises(ValueError, match="rollout-top-p 0.9 is not supported"):
        sampling_extras(SimpleNamespace(rollout_top_p=0.9))
    cfg = plugin_config(SimpleNamespace())
    assert router_url(SimpleNamespace(sglang_router_ip="10.1.1.1", sglang_router_port=3000), cfg) == (
        "http://10.1.1.1:3000"
    )
    with pytest.raises(ValueError, match="sglang_router_ip"):
        router_url(SimpleNamespace(), cfg)
    assert (
        max_context_len(SimpleNamespace(rollout_max_context_len=8192, eval_max_context_len=4096), cfg) == 8192
    )
    assert (
        max_context_len(
            SimpleNamespace(rollout_max_context_len=8192, eval_max_context_len=4096), cfg, evaluation=True
        )
        == 4096
    )
    with pytest.raises(ValueError, match="rollout-max-context-len"):
        max_context_len(SimpleNamespace(rollout_max_context_len=None), cfg)


def test_reward_returns_what_generate_set() -> None:
    a, b = Sample(index=0, reward=0.42), Sample(index=1, reward=0.0)
    assert asyncio.run(reward(None, a)) == 0.42
    assert asyncio.run(reward(None, [a, b])) == [0.42, 0.0]
    with pytest.raises(ValueError, match=r"samples \[5\] have no reward"):
        asyncio.run(reward(None, [a, Sample(index=5)]))


def test_generate_refuses_bad_setups() -> None:
    args = SimpleNamespace(group_rm=False, rollout_temperature=1.0)
    with pytest.raises(ValueError, match="--input-key reference"):
        asyncio.run(generate(args, Sample(prompt=[{"role": "user", "content": "x"}]), {"temperature": 1.0}))
    with pytest.raises(ValueError, match="--group-rm"):
        asyncio.run(generate(SimpleNamespace(group_rm=True), Sample(prompt="src"), {}))
    per_turn = SimpleNamespace(
        group_rm=False, advantage_estimator="grpo", kernel_rl={"episode": {"reward": {"credit": "per_turn"}}}
    )
    with pytest.raises(
        ValueError, match="custom-reward-post-process-path slime_ext.slime_plugins.reward_post"
    ):
        asyncio.run(generate(per_turn, Sample(prompt="src"), {"temperature": 1.0}))


def test_kernel_rl_is_parsed_once_per_args(monkeypatch) -> None:
    """slime passes the same args on every rollout step: the sections are parsed on the first
    call only; another args object, or a new kernel_rl mapping on the same one, is parsed anew."""
    from slime_ext.slime_plugins import config

    parsed: list[str] = []
    real_plugins, real_episode = config.parse_plugin_config, config.episode_config_from_recipe
    monkeypatch.setattr(config, "parse_plugin_config", lambda r: parsed.append("plugins") or real_plugins(r))
    monkeypatch.setattr(
        config, "episode_config_from_recipe", lambda r: parsed.append("episode") or real_episode(r)
    )
    recipe = {"plugins": {"batch_wait_s": 5}, "episode": {"max_turns": 2}}
    args = SimpleNamespace(kernel_rl=recipe)
    cfg, episode = plugin_config(args), episode_config(args)
    assert cfg.batch_wait_s == 5 and episode.max_turns == 2
    for _ in range(3):
        assert plugin_config(args) is cfg and episode_config(args) is episode
    assert parsed == ["plugins", "episode"]

    other = SimpleNamespace(kernel_rl=recipe)
    assert plugin_config(other) == cfg and plugin_config(other) is not cfg
    assert parsed == ["plugins", "episode", "plugins"]

    args.kernel_rl = {"plugins": {"batch_wait_s": 7}}
    assert plugin_config(args).batch_wait_s == 7 and episode_config(args).max_turns == 3
    assert parsed == ["plugins", "episode", "plugins", "plugins", "episode"]


def test_eval_urls_are_read_by_parse_urls() -> None:
    cfg = plugin_config(SimpleNamespace(kernel_rl={"plugins": {"eval_urls": ["a:1/", "http://a:1", "b:2"]}}))
    assert cfg.eval_urls == ("http://a:1", "http://b:2")
    assert plugin_config(SimpleNamespace(kernel_rl={"plugins": {"eval_urls": " , "}})).eval_urls == ()
    with pytest.raises(ValidationError, match=r"kernel_rl\.plugins\.eval_urls: .*scheme must be http"):
        plugin_config(SimpleNamespace(kernel_rl={"plugins": {"eval_urls": "ftp://x"}}))


class _RecordingClient:
    """Stands in for BufferClient: records the control calls, hands out no groups."""

    url = "http://buffer.test"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def set_policy_version(self, version: int) -> dict:
        self.calls.append(f"version {version}")
        return {}

    def start_runner(self) -> dict:
        self.calls.append("start")
        return {}

    def stop_runner(self) -> dict:
        self.calls.append("stop")
        return {}


@pytest.mark.parametrize(
    ("slime_args", "setting", "pauses"),
    [
        ({"colocate": True, "offload_rollout": True}, None, True),
        ({"colocate": False, "offload_rollout": True}, None, True),
        ({"colocate": False, "offload_rollout": False}, None, False),
        ({"colocate": True, "offload_rollout": True}, False, False),
        ({}, True, True),
    ],
)
def test_runner_stops_between_steps_when_slime_offloads_the_engines(
    monkeypatch: pytest.MonkeyPatch, slime_args: dict, setting: bool | None, pauses: bool
) -> None:
    """Colocated engines are offloaded while slime trains: the runner must be stopped by then
    (each step starts it and stops it), else it keeps sending /generate to a released engine."""
    from types import SimpleNamespace

    from slime_ext.slime_plugins import rollout

    client = _RecordingClient()
    state = rollout._BufferState(client)  # type: ignore[arg-type]
    monkeypatch.setattr(rollout, "_state", lambda cfg: state)
    monkeypatch.setattr(rollout, "_collect", lambda *a: f"groups of version {a[-2]}")  # (..., version, extra)
    # slime's own abort-until-idle of its engines (slime_api): recorded, its HTTP is slime's
    monkeypatch.setattr(rollout, "abort_engines_until_idle", lambda args: client.calls.append("abort"))
    plugins = {"buffer_url": client.url} | ({} if setting is None else {"pause_runner": setting})
    args = SimpleNamespace(
        rollout_batch_size=1, n_samples_per_prompt=2, kernel_rl={"plugins": plugins},
        sglang_router_ip="127.0.0.1", sglang_router_port=30000, **slime_args,
    )  # fmt: skip
    assert rollout.runner_pauses(args, rollout.plugin_config(args)) is pauses
    for rid in (0, 1):
        assert rollout.generate_rollout(args, rid, None) == f"groups of version {rid}"
    if pauses:
        assert client.calls == ["version 0", "start", "stop", "abort", "version 1", "start", "stop", "abort"]
    else:
        assert client.calls == ["version 0", "start", "version 1"]
