"""Every command-line tool has the same help style (krl_common/cli.py).

Each CLI's parser is captured from its own `main` (parse_args is replaced by one that hands the
parser back), so the test covers every tool in tools/ and the server/engine entry points without
them having to export their parser, and a new tool is checked as soon as it has a `main`.
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from krl_common.cli import HelpFormatter, make_parser

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = [
    "eval_server.__main__",
    "buffer_server.__main__",
    "slime_ext.dev_engine.engine",
    "slime_ext.dev_engine.tiny_model",
]
CLI_MODULES = (
    sorted(f"tools.{p.stem}" for p in (REPO / "tools").glob("*.py") if "\ndef main(" in p.read_text())
    + ENTRY_POINTS
)


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _parser_of(module_name: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    module = importlib.import_module(module_name)

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(_Captured) as caught:
        module.main([])
    return caught.value.parser


def _all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and its subcommands' parsers."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _all_parsers(sub)
    return found


def test_the_list_covers_the_tools() -> None:
    assert "tools.dry_run" in CLI_MODULES and "tools.compare_runs" in CLI_MODULES
    assert len(CLI_MODULES) >= 18


@pytest.mark.parametrize("module_name", CLI_MODULES)
def test_cli_help_style(module_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    top = _parser_of(module_name, monkeypatch)
    runnable = module_name.removesuffix(".__main__")
    assert top.prog == f"python -m {runnable}"
    for parser in _all_parsers(top):
        assert parser.prog.startswith("python -m "), parser.prog
        assert parser.formatter_class is HelpFormatter, parser.prog
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert (action.help or "").strip(), f"{parser.prog}: {action.dest} has no help"
    text = top.format_help()
    # The description keeps its line breaks: every line of the docstring is a line of the help.
    for line in (top.description or "").strip().splitlines():
        assert line.rstrip() in text, f"description line joined or lost: {line!r}"
    # A usage example continued with a non-raw `\` gets glued to the next line: "1,2      --x".
    assert not re.search(r"\S {3,}--[a-z]", top.description or ""), "example lines joined"


def test_formatter_shows_defaults_but_not_empty_ones() -> None:
    p = make_parser("demo", "Line one.\n  python -m demo --x 1\n  python -m demo --y\n")
    p.add_argument("--x", type=int, default=3, help="a number")
    p.add_argument("--y", action="store_true", help="a switch")
    p.add_argument("--z", help="unset means: every one")
    p.add_argument("--w", default=2, help="already says its default (default: two)")
    text = p.format_help()
    assert "usage: python -m demo" in text
    assert "  python -m demo --x 1\n  python -m demo --y\n" in text
    assert "a number (default: 3)" in text
    assert "a switch\n" in text and "every one\n" in text
    assert "(default: two)\n" in text and text.count("(default:") == 2


@pytest.mark.parametrize("old", ["slime_ext.tiny_engine", "slime_ext.tiny_model"])
def test_old_engine_paths_still_run(old: str) -> None:
    """`python -m slime_ext.tiny_engine` / `tiny_model` (the paths before the layout step, in users'
    scripts) run the moved modules' CLIs."""
    proc = subprocess.run([sys.executable, "-m", old, "--help"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    moved = {
        "slime_ext.tiny_engine": "slime_ext.dev_engine.engine",
        "slime_ext.tiny_model": "slime_ext.dev_engine.tiny_model",
    }
    assert f"python -m {moved[old]}" in proc.stdout
