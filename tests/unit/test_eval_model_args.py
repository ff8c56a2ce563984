"""tools.eval_model: the kernel backend comes from --kernel-backend, else the recipe, and is part
of the run's settings (fingerprint and report)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_ext.rollout.prompts import default_prompt
from tools import eval_model

pytestmark = pytest.mark.unit

BASE = ["--out", "o", "--prompts", "p.jsonl", "--url", "http://x/v1", "--model", "m"]


def _config(argv: list[str]):
    args = eval_model.build_parser().parse_args(BASE + argv)
    config = eval_model.episode_config(args)
    return config, eval_model.run_settings(args, config)


def test_kernel_backend_flag_overrides_the_recipe(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("kernel_rl:\n  episode:\n    backend: triton\n    prompt: {one_shot: true}\n")
    triton, triton_run = _config(["--recipe", str(recipe)])
    cuda, cuda_run = _config(["--recipe", str(recipe), "--kernel-backend", "cuda"])
    assert triton.backend == "triton" and triton_run["kernel_backend"] == "triton"
    assert cuda.backend == "cuda" and cuda_run["kernel_backend"] == "cuda"
    # the flag is applied before parsing: CUDA's wording, with the recipe's prompt edits on top
    assert cuda.prompt.instructions == default_prompt("cuda").instructions and cuda.prompt.one_shot
    assert cuda_run["config_id"] != triton_run["config_id"]  # results of one never resume the other


def test_recipe_backend_and_default(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("kernel_rl:\n  episode:\n    backend: cuda\n")
    assert _config(["--recipe", str(recipe)])[0].backend == "cuda"
    assert _config([])[0].backend == "triton"


def test_unknown_kernel_backend_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        eval_model.build_parser().parse_args(BASE + ["--kernel-backend", "hip"])
    assert exc.value.code == 2 and "invalid choice: 'hip'" in capsys.readouterr().err
