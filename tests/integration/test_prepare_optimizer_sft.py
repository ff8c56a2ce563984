"""tools.prepare_optimizer_sft against the REAL eval server on CPU: the CPU evaluator has no
timing, so no pair can be ordered and nothing is written (exit 1, every pair `untimed`); bad input
is exit 2 and an unreachable server exit 3, with nothing written. (The kept path needs a GPU
evaluator: its layout is unit-tested in tests/unit/test_optimizer_sft.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval_server.samples import load_candidate, load_problem
from krl_common.service import free_port
from tools import prepare_optimizer_sft

pytestmark = pytest.mark.integration


def test_untimed_pairs_write_nothing(cpu_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = tmp_path / "pairs.jsonl"
    line = {"key": "relu-a", "reference": load_problem("relu"), "slower": load_candidate("relu__correct"),
            "faster": load_candidate("relu__correct")}  # fmt: skip
    pairs.write_text(json.dumps(line) + "\n")
    out = tmp_path / "opt.jsonl"
    code = prepare_optimizer_sft.main(["--pairs", str(pairs), "--output", str(out), "--eval-url", cpu_server])
    printed = capsys.readouterr()
    assert code == 1 and "untimed 1" in printed.out and not out.exists(), printed
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"key": "x"}) + "\n")
    assert prepare_optimizer_sft.main(["--pairs", str(bad), "--output", str(out), "--eval-url", cpu_server]) == 2
    dead = f"http://127.0.0.1:{free_port()}"
    assert prepare_optimizer_sft.main(["--pairs", str(pairs), "--output", str(out), "--eval-url", dead]) == 3
    assert not out.exists()
