"""tools/run_recipe.py: reading one value and writing the run's recipe copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tools.run_recipe import main

pytestmark = pytest.mark.unit

RECIPE = "# slime key kept\nbuffer_size: 3\nkernel_rl:\n  runner:\n    temperature: 0.8\n  episode:\n    max_turns: 2\n"


def test_get(tmp_path: Path, capsys) -> None:
    (tmp_path / "r.yaml").write_text(RECIPE)
    assert main(["get", str(tmp_path / "r.yaml"), "runner.temperature"]) == 0
    assert capsys.readouterr().out == "0.8\n"
    assert main(["get", str(tmp_path / "r.yaml"), "runner.missing"]) == 2
    assert "kernel_rl.runner.missing not set" in capsys.readouterr().err
    assert main(["get", str(tmp_path / "r.yaml"), "runner.missing", "--default", "x"]) == 0
    assert capsys.readouterr().out == "x\n"
    assert main(["get", str(tmp_path / "r.yaml"), "runner"]) == 2
    assert "not a scalar" in capsys.readouterr().err


def test_write_sets_values_keeps_other_keys_and_validates(tmp_path: Path, capsys) -> None:
    src, out = tmp_path / "r.yaml", tmp_path / "run" / "recipe.yaml"
    src.write_text(RECIPE)
    args = [
        "write",
        str(src),
        str(out),
        "--set",
        "runner.sglang_url=http://h:1",
        "--set",
        "runner.eval_urls=http://e:2",
        "--set",
        "runner.prompt_data=/p.jsonl",
        "--set",
        "runner.tokenizer=/tok",
        "--set",
        "plugins.eval_urls=[http://e:2]",
    ]
    assert main(args) == 0
    data = yaml.safe_load(out.read_text())
    assert data["buffer_size"] == 3
    assert (
        data["kernel_rl"]["runner"]["sglang_url"] == "http://h:1"
        and data["kernel_rl"]["runner"]["temperature"] == 0.8
    )
    assert data["kernel_rl"]["plugins"]["eval_urls"] == ["http://e:2"]
    # A bad value is refused, naming the key, and nothing is written.
    bad = tmp_path / "bad.yaml"
    assert main(["write", str(src), str(bad), "--set", "episode.max_turns=0"]) == 2
    assert "max_turns" in capsys.readouterr().err and not bad.exists()
    assert main(["write", str(src), str(bad), "--set", "novalue"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert [p.name for p in out.parent.iterdir()] == ["recipe.yaml"]  # no temporary left
