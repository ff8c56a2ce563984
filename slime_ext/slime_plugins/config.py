"""Plug-in settings: the `plugins` section of the recipe YAML, read from `args.kernel_rl`.

slime's `--custom-config-path recipe.yaml` setattrs every top-level key of the file onto `args`,
so the recipe's `kernel_rl` mapping arrives as `args.kernel_rl` (`slime_ext/rollout/recipe.py`). The
plug-ins read two sections of it: `episode` (EpisodeConfig, shared with the agent runner) and
`plugins` (this module, strictly validated: an unknown key is an error naming it).

Defaults that depend on the machine come from environment variables, then built-in values:
`KERNEL_RL_BUFFER_URL` (http://127.0.0.1:8889) and `KERNEL_RL_EVAL_URLS` (comma-separated,
http://127.0.0.1:18188).

slime calls the plug-ins with the same `args` on every rollout step: `plugin_config(args)` and
`episode_config(args)` parse `args.kernel_rl` once per args object (and again only when
`args.kernel_rl` is replaced by another mapping) and hand back the same frozen objects.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from krl_common.settings import parse_settings
from krl_common.urls import parse_urls, url_list_setting
from krl_common.validation import check_type
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.recipe import (
    ROOT_KEY,
    check_sections,
    episode_config_from_recipe,
    with_services,
)

__all__ = [
    "DEFAULT_BUFFER_URL",
    "DEFAULT_EVAL_URL",
    "ENV_BUFFER_URL",
    "ENV_EVAL_URLS",
    "SECTION",
    "EvalSettings",
    "PluginConfig",
    "episode_config",
    "parse_plugin_config",
    "plugin_config",
]

SECTION = "plugins"
ENV_BUFFER_URL = "KERNEL_RL_BUFFER_URL"
ENV_EVAL_URLS = "KERNEL_RL_EVAL_URLS"
DEFAULT_BUFFER_URL = "http://127.0.0.1:8889"
DEFAULT_EVAL_URL = "http://127.0.0.1:18188"
# the recipe's `services` keys the plug-ins read when their own section does not set them
PLUGIN_SERVICES = ("buffer_url", "eval_urls", "sglang_url", "tokenizer", "prompt_data")


@dataclass(frozen=True)
class EvalSettings:
    """`plugins.eval`: the evaluation=True path of the rollout function (held-out problems).

    The problems come from slime's `--eval-prompt-data NAME PATH` (each path a prompt-record
    jsonl; slime requires eval datasets whenever `--eval-interval` is set); `prompt_data` /
    `name` / `n_samples_per_prompt` are used only when slime has no eval dataset."""

    prompt_data: str | None = None  # prompt-record jsonl when slime has no --eval-prompt-data
    name: str = "kernelbench"  # its name in slime's eval logs (eval/<name>)
    split: str | None = "holdout"  # only records of this split (None: every record)
    n_samples_per_prompt: int = 1  # default of --n-samples-per-eval-prompt when slime gives none
    max_problems: int | None = None  # the first N records of each set (None: all)
    concurrency: int = 16  # episodes in flight
    temperature: float | None = None  # None: the eval set's / --eval-temperature / --rollout-temperature

    def __post_init__(self) -> None:
        if self.n_samples_per_prompt < 1 or self.concurrency < 1:
            raise ValueError("n_samples_per_prompt and concurrency must be >= 1")
        if self.max_problems is not None and self.max_problems < 1:
            raise ValueError("max_problems must be >= 1 or null")
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError("temperature must be > 0")


@dataclass(frozen=True)
class PluginConfig:
    # rollout function (buffer mode)
    buffer_url: str | None = None  # None: $KERNEL_RL_BUFFER_URL, else DEFAULT_BUFFER_URL
    start_runner: bool = True  # POST /rollout/start on first use (error if the buffer has no runner)
    # Stop the agent runner once a step's groups are collected, start it again at the next step:
    # nothing may reach the engines while slime has offloaded them for training (a /generate then
    # crashed SGLang's scheduler on an H100). None: when slime offloads them (--colocate,
    # --offload-rollout).
    pause_runner: bool | None = None
    batch_wait_s: float = 30.0  # long-poll of one POST /batches
    max_wait_s: float = 3600.0  # give up (TimeoutError) when a batch is not complete after this
    lease_s: float | None = None  # None: the buffer's --lease-s
    policy_version_lag: int = 0  # version reported = rollout_id - lag (0: train.py, 1: train_async.py)
    http_timeout_s: float = 120.0  # buffer requests (on top of the long-poll)
    # episodes run by the plug-ins (custom generate; rollout function with evaluation=True)
    eval_urls: tuple[str, ...] = ()  # empty: $KERNEL_RL_EVAL_URLS, else DEFAULT_EVAL_URL
    eval_timeout_s: float = 900.0  # one evaluation, queueing included
    sglang_url: str | None = None  # None: slime's router http://{sglang_router_ip}:{sglang_router_port}
    tokenizer: str | None = None  # None: args.hf_checkpoint
    max_context_tokens: int | None = None  # None: args.rollout_max_context_len (required one way)
    prompt_data: str | None = None  # prompt records: level / instance_id of in-slime samples
    eval: EvalSettings = field(default_factory=EvalSettings)

    def __post_init__(self) -> None:
        for name in ("batch_wait_s", "max_wait_s", "http_timeout_s", "eval_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.lease_s is not None and self.lease_s <= 0:
            raise ValueError("lease_s must be > 0 or null")
        if self.policy_version_lag < 0:
            raise ValueError("policy_version_lag must be >= 0")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ValueError("max_context_tokens must be >= 2 or null")

    @property
    def resolved_buffer_url(self) -> str:
        url = (self.buffer_url or os.environ.get(ENV_BUFFER_URL) or DEFAULT_BUFFER_URL).rstrip("/")
        return url if "://" in url else "http://" + url

    @property
    def resolved_eval_urls(self) -> list[str]:
        return parse_urls(list(self.eval_urls) or os.environ.get(ENV_EVAL_URLS) or DEFAULT_EVAL_URL)


def parse_plugin_config(recipe: Mapping[str, Any] | None) -> PluginConfig:
    """PluginConfig from a recipe's `plugins` section (defaults when absent); errors name the key."""
    path = f"{ROOT_KEY}.{SECTION}"
    data = with_services(recipe, SECTION, PLUGIN_SERVICES)
    if "eval_urls" in data:  # a comma-separated string or a list; empty: the env var or default
        data["eval_urls"] = url_list_setting(data["eval_urls"], f"{path}.eval_urls", allow_empty=True)
    return parse_settings(PluginConfig, data, path)


@dataclass
class _Parsed:
    """The settings parsed from one args object."""

    args: Any  # held, so that while cached its id() cannot be reused by another object
    recipe: Any  # the args.kernel_rl mapping they were parsed from
    plugins: PluginConfig | None = None
    episode: EpisodeConfig | None = None


_CACHED_ARGS = 8  # one per process in slime; a few in tests
_parsed: collections.OrderedDict[int, _Parsed] = collections.OrderedDict()
_parsed_lock = threading.Lock()


def _entry(args: Any) -> _Parsed:
    """The cache entry of `args` (a new one when `args` or its `kernel_rl` mapping is new).
    Call with `_parsed_lock` held."""
    recipe = getattr(args, ROOT_KEY, None)
    if recipe is not None:
        check_type(ROOT_KEY, recipe, dict)
        check_sections(recipe)
    entry = _parsed.get(id(args))
    if entry is not None and entry.args is args and entry.recipe is recipe:
        _parsed.move_to_end(id(args))
        return entry
    entry = _parsed[id(args)] = _Parsed(args, recipe)
    while len(_parsed) > _CACHED_ARGS:
        _parsed.popitem(last=False)
    return entry


def plugin_config(args: Any) -> PluginConfig:
    """PluginConfig from `args.kernel_rl["plugins"]` (defaults when absent), parsed once per args."""
    with _parsed_lock:
        entry = _entry(args)
        if entry.plugins is None:
            entry.plugins = parse_plugin_config(entry.recipe)
        return entry.plugins


def episode_config(args: Any) -> EpisodeConfig:
    """EpisodeConfig from `args.kernel_rl["episode"]` (the same section the agent runner reads),
    parsed once per args."""
    with _parsed_lock:
        entry = _entry(args)
        if entry.episode is None:
            entry.episode = episode_config_from_recipe(entry.recipe)
        return entry.episode
