"""The agent runner's settings, read once when the buffer server starts.

`RunnerConfig` is the recipe's `runner` section (with the buffer server's flags on top);
`runner_settings` turns a loaded recipe plus those flags into everything the runner reads (its
`runner`, `episode` and `curriculum` sections, typed) in one call. Kept apart from
`agent_runner.py` so that reading and checking settings (the buffer server's start,
`tools/run_recipe.py`) needs none of the runner's loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from buffer_server.runner.curriculum import CurriculumConfig
from buffer_server.runner.scheduler import validate_run_id
from krl_common.settings import parse_settings
from krl_common.urls import url_list_setting
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.problems import SPLITS
from slime_ext.rollout.recipe import ROOT_KEY, episode_config_from_recipe, recipe_section, with_services

__all__ = ["RunnerConfig", "RunnerSettings", "runner_config_from_dict", "runner_settings"]

# the recipe's `services` keys the runner reads when its own section does not set them
RUNNER_SERVICES = ("prompt_data", "sglang_url", "eval_urls", "tokenizer")


@dataclass(frozen=True)
class RunnerConfig:
    """The recipe's `runner` section. See docs/BUFFER_SERVER.md, "The agent runner"."""

    prompt_data: str  # prompt records jsonl (slime_ext.rollout.problems)
    sglang_url: str  # SGLang router (or engine) base URL
    tokenizer: str  # HF tokenizer name or directory (the policy's)
    # eval server URLs (list or comma-separated string in the recipe); required unless eval_fleet
    eval_urls: tuple[str, ...] = ()
    concurrency: int = 32  # episodes in flight at most
    max_ready_groups: int = 16  # backpressure: no new group while this many complete groups wait
    epochs: int = 1
    shuffle_seed: int | None = 0  # None: file order
    temperature: float = 1.0  # must equal slime's --rollout-temperature
    max_context_tokens: int = 32768  # prompt + all turns of one episode
    max_new_tokens: int = 8192  # per generate call, unless episode.max_new_tokens_per_turn is set
    sampling_params: Mapping[str, Any] = field(default_factory=dict)  # top_p, top_k, stop_token_ids, ...
    run_id: str = "run"  # uid prefix; one per database
    split: str | None = "train"  # only prompts of this split run (None: all)
    max_episode_attempts: int = 5  # per sample index, aborted attempts included
    backoff_s: float = 1.0  # first retry delay after an aborted episode (doubles, jittered)
    max_backoff_s: float = 60.0
    stop_timeout_s: float = 300.0  # POST /rollout/stop waits this long for in-flight episodes
    poll_s: float = 0.5  # re-check period while waiting (backpressure, blocked instances)
    eval_timeout_s: float = 900.0
    eval_max_retries: int = 3
    max_in_flight_per_eval_url: int | None = None
    generate_timeout_s: float = 1800.0
    generate_max_retries: int = 3
    routing_key: bool = True  # send X-SMG-Routing-Key = episode uid (router cache affinity)
    trust_remote_code: bool = False  # for the tokenizer
    autostart: bool = False  # start with the server (else POST /rollout/start)
    # multi-node: the run id whose eval servers Ray placed (slime_ext/cluster/eval_fleet.py); their
    # URLs, asked of Ray every eval_fleet_refresh_s, replace eval_urls (which may then be empty)
    eval_fleet: str | None = None
    eval_fleet_refresh_s: float = 5.0
    ray_address: str = "auto"  # the Ray cluster the eval fleet is in

    def __post_init__(self) -> None:
        # Types are checked from the annotations when the section is read (parse_settings).
        for name in ("prompt_data", "sglang_url", "tokenizer"):
            if not getattr(self, name).strip():
                raise ValueError(f"{name}: must not be empty")
        for name in (
            "concurrency",
            "max_ready_groups",
            "epochs",
            "max_context_tokens",
            "max_new_tokens",
            "max_episode_attempts",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        for name in ("eval_max_retries", "generate_max_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")
        if not self.eval_urls and self.eval_fleet is None:
            raise ValueError("eval_urls: must not be empty (or set eval_fleet to find them through Ray)")
        for name in (
            "temperature",
            "stop_timeout_s",
            "poll_s",
            "eval_timeout_s",
            "generate_timeout_s",
            "eval_fleet_refresh_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError("backoff_s, max_backoff_s: need 0 <= backoff_s <= max_backoff_s")
        if self.split is not None and self.split not in SPLITS:
            raise ValueError(f"split: must be one of {list(SPLITS)} or null, got {self.split!r}")
        if self.max_in_flight_per_eval_url is not None and self.max_in_flight_per_eval_url < 1:
            raise ValueError("max_in_flight_per_eval_url: must be >= 1")
        if "temperature" in self.sampling_params:
            raise ValueError("sampling_params: set the temperature with runner.temperature, not here")
        validate_run_id(self.run_id)


def runner_config_from_dict(data: Mapping[str, Any], path: str = f"{ROOT_KEY}.runner") -> RunnerConfig:
    """RunnerConfig from the recipe's `runner` section (plus flag overrides); errors name the key."""
    data = dict(data) if isinstance(data, Mapping) else data  # parse_settings names a non-mapping
    if isinstance(data, dict) and data.get("eval_urls") is not None:
        data["eval_urls"] = url_list_setting(data["eval_urls"], f"{path}.eval_urls", allow_empty=True)
    return parse_settings(RunnerConfig, data, path)


@dataclass(frozen=True)
class RunnerSettings:
    """Everything the agent runner reads from the recipe, typed."""

    runner: RunnerConfig
    episode: EpisodeConfig
    curriculum: CurriculumConfig


def runner_settings(recipe: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> RunnerSettings | None:
    """The recipe's `runner`, `episode` and `curriculum` sections, with the buffer server's runner
    flags (`overrides`, None values ignored) taking precedence over `runner` keys. None when
    neither the recipe nor a flag configures a runner. Raises ValidationError naming the key."""
    flags = {k: v for k, v in overrides.items() if v is not None}
    if not recipe_section(recipe, "runner") and not flags:
        return None
    section = with_services(recipe, "runner", RUNNER_SERVICES)
    section.update(flags)
    return RunnerSettings(
        runner=runner_config_from_dict(section),
        episode=episode_config_from_recipe(recipe),
        curriculum=parse_settings(
            CurriculumConfig, recipe_section(recipe, "curriculum"), f"{ROOT_KEY}.curriculum"
        ),
    )
