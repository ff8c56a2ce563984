"""The trainer command of every launcher mode through slime's REAL `parse_args` (slime and
Megatron-LM from source, tests/real_slime.py; skipped without them). The command is the one the
launcher writes (PRINT_ONLY=1, `RUN_DIR/cmd/trainer.sh`, after `ray_train.sh train*.py`), with the
real Qwen3-8B model flags and a matching HF config; parse_args runs in its own process
(tests/real_slime_parse_args.py). Every flag must be recognised by one of slime's parsers (they
ignore unknown flags silently); without SGLang installed, SGLang's own flags are the ones left, and
are checked where SGLang is installed (the slime image)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_launcher_args import _argv, _run
from tests.real_slime import missing_source_reason

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PLUGINS = "slime_ext.slime_plugins"
SGLANG_FLAGS = ["--sglang-mem-fraction-static", "--sglang-router-port"]  # configs/run/kbench_multiturn.sh


@pytest.fixture(autouse=True)
def sources() -> None:
    reason = missing_source_reason(megatron=True)
    if reason:
        pytest.skip(reason)
    if shutil.which("tmux") is None:  # the launcher checks its tmux session even with PRINT_ONLY
        pytest.skip("tmux is not installed (the launcher needs it)")


def _parse(tmp_path: Path, script: str, **env: str) -> dict[str, Any]:
    """Write the launcher's commands, then parse its trainer command with slime's parse_args."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "Qwen3-8B_torch_dist").mkdir(parents=True)
    (ckpt / "Qwen3-8B").mkdir()
    shutil.copy(REPO / "configs/models/hf_configs/qwen3-8B.json", ckpt / "Qwen3-8B/config.json")
    prompts = tmp_path / "kernelbench.jsonl"
    prompts.write_text("")
    model_args = str(REPO / "configs/models/qwen3-8B.sh")
    res = _run(script, tmp_path, MODEL_ARGS_FILE=model_args, PROMPT_DATA=str(prompts), **env)
    assert res.returncode == 0, res.stderr
    trainer = _argv(tmp_path / "runs" / "r", "trainer")
    assert trainer[2] in ("train.py", "train_async.py")
    out = tmp_path / "parsed.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.real_slime_parse_args", str(out), "--", *trainer[3:]],
        cwd=REPO, env={**os.environ, "PYTHONWARNINGS": "ignore"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    allowed = [] if report["sglang_parsed"] else [f for f in SGLANG_FLAGS if f in trainer]
    assert report["unrecognised"] == allowed, "flags no slime parser knows"
    if allowed:
        warnings.warn(f"SGLang is not installed: its flags {allowed} were not parsed", stacklevel=2)
    return report


def _hooks(args: dict[str, Any]) -> None:
    assert (
        args["rollout_function_path"] == args["eval_function_path"] == f"{PLUGINS}.rollout.generate_rollout"
    )
    assert args["custom_reward_post_process_path"] == f"{PLUGINS}.reward_post.post_process"
    assert args["custom_rollout_log_function_path"] == f"{PLUGINS}.rollout_log.log_rollout"
    assert args["custom_eval_rollout_log_function_path"] == f"{PLUGINS}.rollout_log.log_eval_rollout"
    assert args["kernel_rl"]["plugins"]["buffer_url"] == "http://127.0.0.1:0"  # the recipe, loaded by slime
    assert args["eval_interval"] == 20 and args["input_key"] == "reference"


def test_default_run(tmp_path: Path) -> None:
    args = _parse(tmp_path, "run_kbench_multiturn.sh", NUM_GPUS="8")["args"]
    _hooks(args)
    assert (args["advantage_estimator"], args["rewards_normalization"], args["grpo_std_normalization"]) == (
        "grpo", True, False,
    )  # fmt: skip
    assert args["global_batch_size"] == 32 * 8 and args["rollout_temperature"] == 0.7
    assert (args["tensor_model_parallel_size"], args["context_parallel_size"], args["colocate"]) == (
        2,
        2,
        False,
    )
    assert args["kernel_rl"]["plugins"]["policy_version_lag"] == 0
    # a resume takes this launch's LR schedule (a run extended with more rollouts loads)
    assert (
        args["override_opt_param_scheduler"] is True and args["use_checkpoint_opt_param_scheduler"] is False
    )
    (tmp_path / "kept").mkdir()
    kept = _parse(
        tmp_path / "kept", "run_kbench_multiturn.sh", NUM_GPUS="8", LR_SCHEDULE_ON_RESUME="checkpoint"
    )
    assert kept["args"]["use_checkpoint_opt_param_scheduler"] is True
    assert kept["args"]["override_opt_param_scheduler"] is False


def test_async_run(tmp_path: Path) -> None:
    args = _parse(tmp_path, "run_kbench_multiturn.sh", NUM_GPUS="8", TRAIN_ENTRY="train_async.py")["args"]
    _hooks(args)
    assert args["kernel_rl"]["plugins"]["policy_version_lag"] == 1


def test_colocated_run(tmp_path: Path) -> None:
    env = {"NUM_GPUS": "6", "COLOCATE": "1", "TRAIN_GPUS": "4", "EVAL_GPUS": "2", "N_SAMPLES_PER_PROMPT": "4"}
    args = _parse(tmp_path, "run_kbench_multiturn.sh", **env)["args"]
    _hooks(args)
    assert (
        args["colocate"] is True and args["global_batch_size"] == 32 * 4 and args["n_samples_per_prompt"] == 4
    )


def test_sft_run(tmp_path: Path) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    report = _parse(tmp_path, "run_sft.sh", SFT_DATA=str(data), TRAIN_GPUS="8", TP="4", CP="2")
    args = report["args"]
    assert args["rollout_function_path"] == "slime.rollout.sft_rollout.generate_rollout"
    assert args["debug_train_only"] is True and args["loss_type"] == "sft_loss"
    assert (args["tensor_model_parallel_size"], args["context_parallel_size"]) == (4, 2)
    assert args["override_opt_param_scheduler"] is True
