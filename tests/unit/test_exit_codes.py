"""Every tool in tools/ that reads a named input exits 2 when that input is missing (as argparse
does for a bad flag, krl_common.cli.EXIT_USAGE), so scripts can tell a bad call from failed work."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from krl_common.cli import EXIT_USAGE

pytestmark = pytest.mark.unit

MISSING = "{tmp}/absent/krl-input"  # under the test's tmp_path, never created


def _exit_code(module: str, argv: list[str]) -> int | str | None:
    main = importlib.import_module(module).main
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own refusals
        return exc.code


CASES = {
    "compare_runs": ("tools.compare_runs", [MISSING, MISSING]),
    "convert_hf_to_megatron": ("tools.convert_hf_to_megatron", ["--hf-dir", MISSING, "--out", "{tmp}/o"]),
    "convert_megatron_to_hf": (
        "tools.convert_megatron_to_hf",
        ["--input", MISSING, "--hf-config-dir", MISSING, "--out", "{tmp}/o"],
    ),
    "eval_model": (
        "tools.eval_model",
        ["--prompts", MISSING, "--out", "{tmp}/o", "--url", "u", "--model", "m"],
    ),
    "eval_model --report-only": ("tools.eval_model", ["--out", MISSING, "--report-only"]),
    "gen_model_args": ("tools.gen_model_args", ["--config", MISSING]),
    "prepare_kernelbench": ("tools.prepare_kernelbench", ["--input", MISSING, "--output", "{tmp}/o.jsonl"]),
    "prepare_kernelbook_sft": (
        "tools.prepare_kernelbook_sft",
        ["--input", MISSING, "--output", "{tmp}/o.jsonl"],
    ),
    "run_recipe get": ("tools.run_recipe", ["get", MISSING, "runner.temperature"]),
    "run_recipe write": ("tools.run_recipe", ["write", MISSING, "{tmp}/r.yaml"]),
    "split_prompts": ("tools.split_prompts", [MISSING, "{tmp}/o.jsonl"]),
    "sample_prompts": ("tools.sample_prompts", ["--out", "{tmp}/o.jsonl", "--problems", "nosuch"]),
    "dry_run": ("tools.dry_run", ["--problems", "nosuch", "--run-dir", "{tmp}/run"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_missing_input_exits_2(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module, argv = CASES[case]
    code = _exit_code(module, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == EXIT_USAGE, capsys.readouterr()
    err = capsys.readouterr().err
    assert "krl-input" in err or "nosuch" in err, err  # the message names what is missing
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.jsonl").exists()
