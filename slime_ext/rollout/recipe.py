"""The recipe settings file: one YAML read by the buffer's agent runner and by the slime plug-ins.

The file has one top-level key, `kernel_rl`, so the same file can be given to slime as
`--custom-config-path` (slime setattrs every top-level key onto `args`: the plug-ins then read
`args.kernel_rl`) and to the buffer server (`--recipe`). Sections under `kernel_rl`:

- `episode`: the multi-turn episode (`EpisodeConfig`): `backend` (the kernel language, `triton`
  or `cuda`: it picks the prompt wording and goes with every eval request), `max_turns`,
  `max_new_tokens_per_turn`, `enable_thinking`, `end_of_turn`, `chat_template_kwargs`, the nested `prompt`
  (`PromptConfig`), `reward` (`RewardConfig`: rewards, `gamma`, `credit`, early stop) and
  `eval_options` (the eval request's options) sections.
- `services`: where the run's services are (`sglang_url`, `eval_urls`, `buffer_url`,
  `prompt_data`, `tokenizer`), written once and read by the agent runner and the plug-ins alike
  (`with_services`); a component section may set one of these itself only when `services`
  does not (the same key set to two values is an error naming both).
- `runner` and `curriculum` (the buffer's agent runner) and `plugins` (the slime plug-ins) belong
  to the component that reads them; each validates its own section (unknown keys are errors
  there too). Any other section name is an error here (`check_sections`), so a misspelled
  section is not silently ignored.

Unknown keys are errors that name the key, so a typo never silently falls back to a default.
Each section is read once per process into its typed dataclass (`krl_common/settings.py`: the
types come from the dataclass annotations); `episode_config_from_recipe` is the one reader of the
`episode` section for the runner, the plug-ins and the tools.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from eval_server.schema import EvalOptions, parse_options
from krl_common.settings import parse_settings
from krl_common.urls import url_list_setting
from krl_common.validation import ValidationError, check_type
from slime_ext.clients.backends import DEFAULT_BACKEND, check_backend
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.prompts import PromptConfig, default_prompt
from slime_ext.rollout.roles import RolePrompt

__all__ = [
    "ROOT_KEY",
    "SECTIONS",
    "check_sections",
    "episode_config_from_dict",
    "episode_config_from_recipe",
    "load_recipe",
    "recipe_section",
    "with_services",
]

ROOT_KEY = "kernel_rl"
SECTIONS = ("services", "episode", "runner", "curriculum", "plugins")
SERVICE_KEYS = ("sglang_url", "eval_urls", "buffer_url", "prompt_data", "tokenizer")


def check_sections(recipe: Mapping[str, Any]) -> None:
    """A ValidationError naming each section of `kernel_rl` no component reads (with the closest
    known name)."""
    unknown = [k for k in recipe if k not in SECTIONS]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(str(k), SECTIONS, n=1)
            hints.append(f"{ROOT_KEY}.{k}" + (f" (did you mean {ROOT_KEY}.{close[0]}?)" if close else ""))
        raise ValidationError(
            f"unknown recipe section {', '.join(hints)}; the sections are {', '.join(SECTIONS)}"
        )


def load_recipe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The `kernel_rl` mapping of a recipe YAML file (other top-level keys are slime's)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"recipe file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValidationError(f"{p}: not valid YAML ({exc})") from None
    if not isinstance(data, dict) or ROOT_KEY not in data:
        raise ValidationError(f"{p}: expected a mapping with a top-level {ROOT_KEY!r} key")
    section = data[ROOT_KEY]
    check_type(ROOT_KEY, section, dict)
    try:
        check_sections(section)
    except ValidationError as exc:
        raise ValidationError(f"{p}: {exc}") from None
    return section


def recipe_section(recipe: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """One section of the recipe mapping (empty when absent), type-checked."""
    if recipe is None:
        return {}
    value = recipe.get(name, {})
    if value is None:
        return {}
    check_type(f"{ROOT_KEY}.{name}", value, dict)
    return dict(value)


def _unset(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | tuple) and not value)


def _same(key: str, a: Any, b: Any) -> bool:
    if key == "eval_urls":
        return url_list_setting(a, key) == url_list_setting(b, key)
    return a == b


def with_services(recipe: Mapping[str, Any] | None, name: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """Section `name` with its unset `keys` taken from the `services` section (unknown keys of
    `services` are errors; a key set in both to different values is an error naming both)."""
    section = recipe_section(recipe, name)
    services = recipe_section(recipe, "services")
    unknown = sorted(set(services) - set(SERVICE_KEYS))
    if unknown:
        raise ValidationError(
            f"unknown key {', '.join(f'{ROOT_KEY}.services.{k}' for k in unknown)}; "
            f"the services are {', '.join(SERVICE_KEYS)}"
        )
    for key in keys:
        shared = services.get(key)
        if _unset(shared):
            continue
        own = section.get(key)
        if not _unset(own) and not _same(key, own, shared):
            raise ValidationError(
                f"{ROOT_KEY}.{name}.{key} ({own!r}) and {ROOT_KEY}.services.{key} ({shared!r}) differ: "
                f"set it once, in services (read by the agent runner and the plug-ins)"
            )
        section[key] = shared
    return section


def episode_config_from_recipe(
    recipe: Mapping[str, Any] | None, *, backend: str | None = None
) -> EpisodeConfig:
    """EpisodeConfig of a loaded recipe's `episode` section (defaults without a recipe). `backend`
    (a tool's flag) replaces the recipe's before parsing: the backend picks the prompt wording."""
    section = recipe_section(recipe, "episode")
    if backend is not None:
        section["backend"] = backend
    return episode_config_from_dict(section)


def episode_config_from_dict(
    data: Mapping[str, Any] | None, path: str = f"{ROOT_KEY}.episode"
) -> EpisodeConfig:
    """EpisodeConfig from the `episode` section (None or {} gives the defaults).

    Two nested sections are read here rather than from their annotations: `prompt` edits the
    backend's wording (Triton's or CUDA's) key by key, and `eval_options` is the eval request's
    wire format, read by its own parser (eval_server/schema.py)."""
    section = {} if data is None else data
    if isinstance(section, Mapping):
        section = dict(section)
        backend = check_backend(section.get("backend", DEFAULT_BACKEND), f"{path}.backend")
        if section.get("prompt") is not None:
            section["prompt"] = _prompt_config(section["prompt"], f"{path}.prompt", default_prompt(backend))
        if "eval_options" in section:
            section["eval_options"] = _eval_options(section["eval_options"], f"{path}.eval_options", path)
    return parse_settings(EpisodeConfig, section, path)


def _prompt_config(data: Any, path: str, base: PromptConfig) -> PromptConfig:
    """The prompt section over the backend's wording; `roles` maps a role name (roles.py) to its
    RolePrompt (`preamble`, `instruction`)."""
    if not isinstance(data, Mapping) or data.get("roles") is None:
        return parse_settings(PromptConfig, data, path, base=base)
    data = dict(data)
    roles = data.pop("roles")
    if not isinstance(roles, Mapping):
        raise ValidationError(f"{path}.roles: expected a mapping of role -> {{preamble, instruction}}")
    parsed = {
        name: parse_settings(RolePrompt, value or {}, f"{path}.roles.{name}") for name, value in roles.items()
    }
    try:  # PromptConfig names the roles it does not know
        return dataclasses.replace(parse_settings(PromptConfig, data, path, base=base), roles=parsed)
    except ValueError as exc:
        raise ValidationError(f"{path}: {exc}") from None


def _eval_options(data: Any, path: str, episode_path: str) -> EvalOptions:
    if isinstance(data, Mapping) and "backend" in data:
        raise ValidationError(
            f"{path}.backend: set {episode_path}.backend instead (the one setting that picks "
            "both the prompts and the evaluator's backend)"
        )
    try:
        return parse_options(data or {})
    except ValueError as exc:
        raise ValidationError(f"{path}: {exc}") from None
