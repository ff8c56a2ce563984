"""The recipe settings file: one YAML read by the buffer's agent runner and by the slime plug-ins.

The file has one top-level key, `kernel_rl`, so the same file can be given to slime as
`--custom-config-path` (slime setattrs every top-level key onto `args`: the plug-ins then read
`args.kernel_rl`) and to the buffer server (`--recipe`). Sections under `kernel_rl`:

- `episode`: the multi-turn episode (`EpisodeConfig`): `backend` (the kernel language, `triton`
  or `cuda`: it picks the prompt wording and goes with every eval request), `max_turns`,
  `max_new_tokens_per_turn`, `enable_thinking`, `end_of_turn`, `chat_template_kwargs`, the nested `prompt`
  (`PromptConfig`), `reward` (`RewardConfig`: rewards, `gamma`, `credit`, early stop) and
  `eval_options` (the eval request's options) sections.
- Other sections (`runner`, `buffer`, `eval`, `curriculum`, ...) belong to the component that
  reads them; each component validates its own section (unknown keys are errors there too).

Unknown keys are errors that name the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from eval_server.schema import parse_options
from krl_common.validation import ValidationError, check_type, reject_unknown
from slime_ext.clients.backends import DEFAULT_BACKEND, check_backend
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.prompts import PromptConfig, default_prompt
from slime_ext.rollout.rewards import RewardConfig

__all__ = ["ROOT_KEY", "dataclass_from_dict", "episode_config_from_dict", "load_recipe", "recipe_section"]

ROOT_KEY = "kernel_rl"
_NESTED = {"prompt", "reward", "eval_options"}


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


def dataclass_from_dict(cls: type, data: Mapping[str, Any], path: str, base: Any = None) -> Any:
    """Build a (frozen) dataclass from a mapping: unknown keys rejected, list -> tuple where the
    default is a tuple, constructor errors re-raised as ValidationError naming `path`. With
    `base` (an instance of cls), the mapping's keys replace its values instead of the defaults."""
    check_type(path, data, dict)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    reject_unknown(path, dict(data), set(fields))
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        default = fields[key].default
        kwargs[key] = tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{path}: {exc}") from None


def episode_config_from_dict(
    data: Mapping[str, Any] | None, path: str = f"{ROOT_KEY}.episode"
) -> EpisodeConfig:
    """EpisodeConfig from the `episode` section (None or {} gives the defaults)."""
    data = dict(data or {})
    check_type(path, data, dict)
    reject_unknown(path, data, {f.name for f in dataclasses.fields(EpisodeConfig)})
    top = {k: v for k, v in data.items() if k not in _NESTED}
    backend = check_backend(data.get("backend", DEFAULT_BACKEND), f"{path}.backend")
    if "prompt" in data:
        # The prompt section changes the backend's wording (Triton's or CUDA's), key by key.
        top["prompt"] = dataclass_from_dict(
            PromptConfig, data["prompt"] or {}, f"{path}.prompt", base=default_prompt(backend)
        )
    if "reward" in data:
        top["reward"] = dataclass_from_dict(RewardConfig, data["reward"] or {}, f"{path}.reward")
    if "eval_options" in data:
        if isinstance(data["eval_options"], Mapping) and "backend" in data["eval_options"]:
            raise ValidationError(
                f"{path}.eval_options.backend: set {path}.backend instead (the one setting that picks "
                "both the prompts and the evaluator's backend)"
            )
        try:
            top["eval_options"] = parse_options(data["eval_options"] or {})
        except ValueError as exc:
            raise ValidationError(f"{path}.eval_options: {exc}") from None
    return dataclass_from_dict(EpisodeConfig, top, path)
