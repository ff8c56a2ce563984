"""Recipe helpers for the shell launchers (thin CLI over `slime_ext/rollout/recipe.py`).

  python -m tools.run_recipe get RECIPE KEY [--default VALUE]
      print one scalar under `kernel_rl` (dotted KEY, e.g. runner.temperature); exit 2 naming
      the key when it is missing and no default is given.
  python -m tools.run_recipe write RECIPE OUT --set KEY=VALUE ...
      write the run's copy of the recipe with the given values set (VALUE is read as YAML, so
      0.8 is a number and a,b stays a string), validated (episode section; runner section when
      the agent runner is installed), atomically (temporary name, then rename).
      `--slime-default KEY=VALUE`: a top-level key for slime, written only when the recipe does
      not set it (the launcher's MISMATCH=mrs settings of slime's rollout-correction function).

The launcher writes RUN_DIR/recipe.yaml this way: the user's recipe plus this run's URLs and
paths, so the buffer's runner and slime's plug-ins (`--custom-config-path`) read one file.
Exit code 2 with one line for a missing or invalid recipe, key or value (as for usage errors).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from krl_common.cli import EXIT_USAGE, HelpFormatter, make_parser
from krl_common.fileio import atomic_write
from krl_common.validation import ValidationError
from slime_ext.rollout.recipe import ROOT_KEY, episode_config_from_recipe, load_recipe, with_services
from slime_ext.slime_plugins.config import parse_plugin_config

__all__ = ["lookup", "main", "with_values"]


def lookup(recipe: dict[str, Any], key: str) -> Any:
    """The value at dotted `key` under the root; KeyError naming the first missing part."""
    value: Any = recipe
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"{ROOT_KEY}.{'.'.join(parts[: i + 1])} not set")
        value = value[part]
    return value


def _assignment(flag: str, item: str) -> tuple[str, Any]:
    """KEY and its VALUE read as YAML (so 0.8 is a number, a,b a string) of `KEY=VALUE`."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ValidationError(f"{flag} {item!r}: expected KEY=VALUE")
    return key, yaml.safe_load(raw) if raw else ""


def with_values(recipe: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """A copy of `recipe` with each `dotted.key=yaml-value` assignment applied."""
    out = copy.deepcopy(recipe)
    for item in assignments:
        key, value = _assignment("--set", item)
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValidationError(f"--set {item!r}: {part} is not a section")
            node = child
        node[parts[-1]] = value
    return out


def validate(recipe: dict[str, Any]) -> None:
    """Validate the sections this project knows (each by its owner's parser)."""
    episode_config_from_recipe(recipe)
    parse_plugin_config(recipe)
    try:
        from buffer_server.runner.config import RUNNER_SERVICES, runner_config_from_dict
    except ImportError:
        return
    if recipe.get("runner") is not None:
        runner_config_from_dict(with_services(recipe, "runner", RUNNER_SERVICES))


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.run_recipe", __doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("get", help="print one value", formatter_class=HelpFormatter)
    g.add_argument("recipe", help="recipe YAML")
    g.add_argument("key", help="dotted key under kernel_rl, e.g. runner.temperature")
    g.add_argument("--default", help="printed when the key is missing")
    w = sub.add_parser("write", help="write the run's recipe copy", formatter_class=HelpFormatter)
    w.add_argument("recipe", help="recipe YAML to copy")
    w.add_argument("out", help="where to write the copy")
    w.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a dotted kernel_rl key (repeatable; default: none)",
    )
    w.add_argument(
        "--slime-default",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a top-level key for slime (--custom-config-path sets it on its args), written only when "
        "the recipe does not set it (repeatable; default: none)",
    )
    args = p.parse_args(argv)
    try:
        recipe = load_recipe(args.recipe)
        if args.cmd == "get":
            try:
                value = lookup(recipe, args.key)
            except KeyError as exc:
                if args.default is None:
                    raise ValidationError(f"{args.recipe}: {exc.args[0]}") from None
                value = args.default
            if isinstance(value, (dict, list)):
                raise ValidationError(f"{args.key} is a {type(value).__name__}, not a scalar")
            print(str(value).lower() if isinstance(value, bool) else value)
            return 0
        updated = with_values(recipe, args.set)
        validate(updated)
        # Other top-level keys are slime's (--custom-config-path setattrs them): keep them.
        full = yaml.safe_load(Path(args.recipe).read_text(encoding="utf-8"))
        full[ROOT_KEY] = updated
        for item in args.slime_default:
            key, value = _assignment("--slime-default", item)
            if key == ROOT_KEY:
                raise ValidationError(
                    f"--slime-default {item!r}: expected KEY=VALUE (a top-level key other than {ROOT_KEY})"
                )
            full.setdefault(key, value)
        atomic_write(Path(args.out), yaml.safe_dump(full, sort_keys=False))
        return 0
    except (FileNotFoundError, ValidationError) as exc:
        print(f"run_recipe: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
