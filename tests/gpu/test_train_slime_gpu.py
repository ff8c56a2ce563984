"""The trainer for real on one GPU: upstream slime's `train.py` (unmodified, `--debug-train-only`)
trains the tiny Qwen3 model with Megatron + Transformer Engine on trajectories our own stack
produced, and the saved checkpoint comes back through our converter.

What runs, per credit mode (`trajectory`, `per_turn`): the launcher's single-GPU preset
(`PRESET=single_gpu_tiny TRAIN_ONLY=1 scripts/run_kbench_multiturn.sh`) in its tmux layout:
the embedded `/generate` engine on the GPU in its labelled scripted-mix mode (bundled correct and
wrong candidates, log-probs teacher-forced by the model), the eval server on GPU 0 (timing on),
the buffer server with its agent runner, and Ray + slime's `train.py` with our buffer-mode
rollout function, reward post-process, rollout-log plug-ins and the run recipe
(`--custom-config-path`), KL loss on (so `--ref-load` is loaded), `--save` at the last step.
Then: slime's log holds each step's loss and grad norm and our rollout metrics; the last
`iter_XXXXXXX` converts to HF with `tools/convert_megatron_to_hf`; transformers loads it; its
weights differ from the initial ones; its logits are finite.

Parallel layouts (`LAYOUTS`): the same preset at TP=1 (1 GPU), TP=2 with sequence parallelism
(2 GPUs), CP=2 (2 GPUs) and TP=2 x CP=2 (4 GPUs), `--use-dynamic-batch-size` in all; a layout
skips when fewer GPUs are visible. slime's argument dump must show the layout, and at step 0
(initial weights) the trainer's log-probs of the rollout tokens must match the engine's (the
initial HF model in transformers, no parallelism) within bf16 tolerance
(`train/train_rollout_logprob_abs_diff`, the mean absolute per-token difference).

Needs, on the GPU machine (docs/GPU_TESTS.md says how they were brought there): slime's source
(`SLIME_DIR`, default third_party/slime) and Megatron-LM's (`MEGATRON_DIR`, default
third_party/Megatron-LM) at the pinned commits, Ray's CLI, Transformer Engine, SGLang and the
router importable by the trainer (`PYTHONPATH`, `TRAINER_PYTHONPATH`), tmux. Skips, saying what is
missing, otherwise. `KRL_GPU_ARTIFACTS=DIR` keeps the logs and a summary (JSON) there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.launched import REPO, artifacts, launcher_env, log_since, run_launcher
from tests.gpu.launched import run_checked as _run

SLIME_DIR = Path(os.environ.get("SLIME_DIR", REPO / "third_party" / "slime"))
MEGATRON_DIR = os.environ.get("MEGATRON_DIR", str(REPO / "third_party" / "Megatron-LM"))
RUN_TIMEOUT_S = float(os.environ.get("KRL_TRAIN_TIMEOUT_S", "600"))
# TP, CP of each parallel layout (GPUs = TP x CP); the eval server and the engine share GPU 0.
LAYOUTS = {"tp1": (1, 1), "tp2": (2, 1), "cp2": (1, 2), "tp2cp2": (2, 2)}
# Step 0, initial weights: the trainer's per-token log-probs against the engine's. bf16 Megatron
# vs the engine's transformers forward measured 0.064 at TP=1 (H100, 2026-11-24).
STEP0_LOGPROB_TOL = 0.1
ARG_RE = re.compile(r"^\s+([a-z_]+) \.+ (.*)$", re.M)
STEP_RE = re.compile(r"model\.py:\d+ - step (\d+): (\{.*\})")
ROLLOUT_RE = re.compile(r"rollout_metrics\.py:\d+ - perf (\d+): (\{.*\})")

pytestmark = pytest.mark.gpu


def _missing() -> list[str]:
    import torch

    missing = []
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU")
    if not (SLIME_DIR / "train.py").is_file():
        missing.append(f"slime's source at {SLIME_DIR} (SLIME_DIR; scripts/fetch_upstream.sh)")
    if not any((Path(p) / "megatron" / "core").is_dir() for p in MEGATRON_DIR.split(":")):
        missing.append(f"Megatron-LM at {MEGATRON_DIR} (MEGATRON_DIR)")
    for tool in ("ray", "tmux"):
        if shutil.which(tool) is None:
            missing.append(f"the {tool} command")
    return missing


def _dicts(pattern: re.Pattern[str], log: str) -> dict[int, dict[str, Any]]:
    """`step N: {...}` lines of slime's log as {N: metrics} (Python reprs of float dicts)."""
    import ast

    out = {}
    for m in pattern.finditer(log):
        text = re.sub(r"\b(nan|inf)\b", "None", m.group(2))  # float reprs literal_eval cannot read
        out[int(m.group(1))] = ast.literal_eval(text)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    missing = _missing()
    if missing:
        pytest.skip("needs " + "; ".join(missing))
    root = tmp_path_factory.mktemp("slime_train")
    env = launcher_env()
    hf = root / "Qwen3-tiny"
    _run([sys.executable, "-m", "slime_ext.dev_engine.tiny_model", "--out", str(hf)], env)
    _run(
        [
            sys.executable,
            "-m",
            "tools.convert_hf_to_megatron",
            "--hf-dir",
            str(hf),
            "--out",
            f"{hf}_torch_dist",
            "--dtype",
            "bf16",
        ],
        env,
    )
    prompts = root / "sample_prompts.jsonl"
    _run([sys.executable, "-m", "tools.sample_prompts", "--out", str(prompts)], env)
    env.update(
        PRESET="single_gpu_tiny",
        TRAIN_ONLY="1",
        CKPT_ROOT=str(root),
        PROMPT_DATA=str(prompts),
        RUNS_ROOT=str(root / "runs"),
        SLIME_DIR=str(SLIME_DIR),
        MEGATRON_DIR=MEGATRON_DIR,
        PYTHON=sys.executable,
        ROLLOUT_BATCH_SIZE=os.environ.get("ROLLOUT_BATCH_SIZE", "2"),
    )
    return {"root": root, "hf": hf, "env": env}


def _slime_args(log: str) -> dict[str, str]:
    """The `name ..... value` lines of slime's argument dump."""
    return {m.group(1): m.group(2).strip() for m in ARG_RE.finditer(log)}


def _train(base: dict[str, Any], credit: str, layout: str, label: str = "", **extra: str) -> dict[str, Any]:
    tp, cp = LAYOUTS[layout]
    name = f"{credit}-{layout}"
    env = {
        **base["env"],
        "CREDIT": credit,
        "RUN_NAME": f"train-{name}",
        "TMUX_SESSION": f"krl-gpu-{name}",
        "TP": str(tp),
        "CP": str(cp),
        "TRAIN_GPUS": str(tp * cp),
        **extra,  # a caller's RUN_NAME etc. win
    }
    run_dir, log, wall = run_launcher("run_kbench_multiturn.sh", env, label or name, RUN_TIMEOUT_S)
    return {"run_dir": run_dir, "log": log, "wall_s": wall}


def _convert_and_check(base: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ckpt = run_dir / "checkpoints"
    it = (ckpt / "latest_checkpointed_iteration.txt").read_text().strip()
    it_dir = ckpt / f"iter_{int(it):07d}"
    assert it_dir.is_dir(), f"no {it_dir}"
    out = run_dir / "hf_out"
    _run(
        [
            sys.executable,
            "-m",
            "tools.convert_megatron_to_hf",
            "--input",
            str(it_dir),
            "--hf-config-dir",
            str(base["hf"]),
            "--out",
            str(out),
        ],
        base["env"],
    )
    model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    # REF_LOAD holds the initial weights rounded to bf16 (--dtype bf16): compare with those.
    before = {k: v.bfloat16().float() for k, v in load_file(str(base["hf"] / "model.safetensors")).items()}
    after = {k: v.float() for k, v in model.state_dict().items() if k in before}
    assert set(after) == set(before)
    changed = {k: (after[k] - before[k]).abs().max().item() for k in before}
    ids = torch.arange(1, 65).unsqueeze(0)
    with torch.no_grad():
        logits = model(ids).logits
    return {
        "iteration": int(it),
        "checkpoint": str(it_dir),
        "tensors_changed": sum(v > 0 for v in changed.values()),
        "tensors": len(changed),
        "max_abs_change": max(changed.values()),
        "logits_finite": bool(torch.isfinite(logits).all()),
    }


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
@pytest.mark.parametrize(
    "credit,layout",
    [
        ("trajectory", "tp1"),
        ("per_turn", "tp1"),
        ("per_turn", "tp2"),
        ("per_turn", "cp2"),
        ("per_turn", "tp2cp2"),
    ],
)
def test_slime_trains_on_our_rollouts(base: dict[str, Any], credit: str, layout: str) -> None:
    import torch

    tp, cp = LAYOUTS[layout]
    if torch.cuda.device_count() < tp * cp:
        pytest.skip(f"layout {layout} needs {tp * cp} GPUs, {torch.cuda.device_count()} visible")
    run = _train(base, credit, layout)
    args = _slime_args(run["log"])
    layout_seen = {
        k: args.get(k)
        for k in (
            "tensor_model_parallel_size",
            "context_parallel_size",
            "sequence_parallel",
            "use_dynamic_batch_size",
        )
    }
    assert layout_seen == {
        "tensor_model_parallel_size": str(tp),
        "context_parallel_size": str(cp),
        "sequence_parallel": str(tp > 1),
        "use_dynamic_batch_size": "True",
    }, layout_seen
    steps = _dicts(STEP_RE, run["log"])
    rollouts = _dicts(ROLLOUT_RE, run["log"])
    num_rollout = 3  # the preset's NUM_ROLLOUT, one optimizer step per rollout (global batch = all)
    assert sorted(steps) == list(range(num_rollout)), f"slime logged steps {sorted(steps)}"
    for m in steps.values():
        assert {"train/loss", "train/grad_norm", "train/kl_loss", "train/pg_loss"} <= set(m)
    assert any(m["train/grad_norm"] > 0 for m in steps.values()), steps
    step0_diff = steps[0]["train/train_rollout_logprob_abs_diff"]
    assert step0_diff <= STEP0_LOGPROB_TOL, f"step 0 log-prob difference {step0_diff} at {layout}"
    assert sorted(rollouts) == list(range(num_rollout)), f"rollout metrics of steps {sorted(rollouts)}"
    correct = [m["rollout/kernel/correct_rate"] for m in rollouts.values()]
    assert any(0 < c < 1 for c in correct), f"no mixed group outcomes: correct_rate {correct}"
    result = _convert_and_check(base, run["run_dir"])
    assert result["iteration"] == num_rollout - 1
    assert result["tensors_changed"] > 0, result
    assert result["logits_finite"], result
    art = artifacts()
    if art is not None:
        summary = dict(
            result,
            credit=credit,
            layout=layout,
            slime_layout=layout_seen,
            step0_logprob_abs_diff=step0_diff,
            wall_s=round(run["wall_s"], 1),
            steps=steps,
            correct_rate=correct,
        )
        (art / f"summary-{credit}-{layout}.json").write_text(json.dumps(summary, indent=1, default=str))


@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)
def test_a_finished_run_extended_by_one_rollout_resumes(base: dict[str, Any]) -> None:
    """The same RUN_NAME launched again with NUM_ROLLOUT one larger trains that one step from the
    saved checkpoint. slime sizes Megatron's LR schedule from num_rollout, so the schedule differs:
    the launcher's LR_SCHEDULE_ON_RESUME=args (default) lets Megatron load it (without it the
    climb test's resume stopped at "... total number of iterations do not match", H200)."""
    first = _train(base, "trajectory", "tp1", "resume-first", NUM_ROLLOUT="2", RUN_NAME="train-resume")
    assert sorted(_dicts(STEP_RE, first["log"])) == [0, 1]
    second = _train(base, "trajectory", "tp1", "resume-second", NUM_ROLLOUT="3", RUN_NAME="train-resume")
    new = log_since(second["log"], first["log"])
    assert sorted(_dicts(STEP_RE, new)) == [2], sorted(_dicts(STEP_RE, new))
    it = (second["run_dir"] / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip()
    assert it == "2", it
