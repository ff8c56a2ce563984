"""slime's SFT for real through our `scripts/run_sft.sh`, on warm-start data our own tool makes from
the bundled sample problems, and the SFT model, served by SGLang, writes kernels the eval server
scores.

What runs: the tiny Qwen3 at head dim 64 (`tiny_model --size hd64`, random weights), converted to
torch_dist; `tools.prepare_sample_sft` (each sample problem's first prompt answered once correctly
and once wrongly, half the data correct); `PRESET=single_gpu_tiny scripts/run_sft.sh` (Ray +
upstream slime's `train_async.py` with slime's SFT rollout and loss, loss mask from the chat
template); the last checkpoint converted back to HF; SGLang serves it (triton attention) and
`tools.eval_model --backend sglang` samples one turn per episode on the sample prompts against
the eval server on the same GPU.

Asserted: slime's SFT loss falls to a tenth of its first value; the SFT model writes answers that
compile, at a measured rate (printed and, with `KRL_GPU_ARTIFACTS=DIR`, written to
DIR/summary-sft.json with the loss curve and the report). Settings: KRL_SFT_EPOCHS,
KRL_SFT_LR, KRL_SFT_REPEAT, KRL_SFT_SAMPLES (episodes per problem in the evaluation).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from eval_server.launch import first_gpu
from tests.gpu.launched import artifacts, launcher_env, run_launcher, sglang_server
from tests.gpu.launched import run_checked as _run
from tests.gpu.test_train_slime_gpu import MEGATRON_DIR, SLIME_DIR, STEP_RE, _dicts, _missing

pytestmark = pytest.mark.gpu

EPOCHS = int(os.environ.get("KRL_SFT_EPOCHS", "300"))  # 300 steps: loss 7.19 -> 0.0035 on an H100
LR = os.environ.get("KRL_SFT_LR", "3e-3")
REPEAT = int(os.environ.get("KRL_SFT_REPEAT", "2"))  # 24 examples: 8 correct, 8 wrong, 8 two-turn fixes
SAMPLES = int(os.environ.get("KRL_SFT_SAMPLES", "8"))
RUN_TIMEOUT_S = float(os.environ.get("KRL_TRAIN_TIMEOUT_S", "900"))


def _needs() -> list[str]:
    missing = _missing()
    try:
        import sglang  # noqa: F401
    except ImportError:
        missing.append("sglang (scripts/gpu_env/trainer.lock)")
    return missing


def warm_start(tmp_path: Path) -> dict[str, Any]:
    """The SFT warm start: the hd64 model, the sample SFT data, slime's SFT through
    scripts/run_sft.sh, the last checkpoint back to HF (`model`), the loss curve."""
    env = launcher_env()
    hf = tmp_path / "Qwen3-tiny-hd64"
    _run([sys.executable, "-m", "slime_ext.dev_engine.tiny_model", "--size", "hd64", "--out", str(hf)], env)
    _run([sys.executable, "-m", "tools.convert_hf_to_megatron", "--hf-dir", str(hf), "--out", f"{hf}_torch_dist",
          "--dtype", "bf16"], env)  # fmt: skip
    data = tmp_path / "sample_sft.jsonl"  # prompts of the launcher's default recipe, as the RL run's
    _run(
        [sys.executable, "-m", "tools.prepare_sample_sft", "--output", str(data), "--repeat", str(REPEAT)],
        env,
    )
    n_examples = sum(1 for _ in data.open())
    batch = n_examples  # one step an epoch, whatever the data holds
    steps = EPOCHS
    env.update(
        PRESET="single_gpu_tiny",
        CKPT_ROOT=str(tmp_path),
        RUNS_ROOT=str(tmp_path / "runs"),
        RUN_NAME="sft-warm-start",
        TMUX_SESSION="krl-gpu-sft",
        SFT_DATA=str(data),
        SFT_BATCH_SIZE=str(batch),
        SFT_NUM_EPOCH=str(EPOCHS),
        SFT_LR=LR,
        SFT_SAVE_INTERVAL=str(10 * steps),  # slime saves the last step anyway
        SLIME_DIR=str(SLIME_DIR),
        MEGATRON_DIR=MEGATRON_DIR,
        PYTHON=sys.executable,
    )
    run_dir, log, sft_s = run_launcher("run_sft.sh", env, "sft", RUN_TIMEOUT_S, what="SFT trainer")
    losses = {k: v["train/loss"] for k, v in _dicts(STEP_RE, log).items()}
    assert losses, f"no step lines in slime's log:\n{log[-4000:]}"
    ckpt = run_dir / "checkpoints"
    it = int((ckpt / "latest_checkpointed_iteration.txt").read_text().strip())
    out = tmp_path / "sft_hf"
    _run([sys.executable, "-m", "tools.convert_megatron_to_hf", "--input", str(ckpt / f"iter_{it:07d}"),
          "--hf-config-dir", str(hf), "--out", str(out)], env)  # fmt: skip
    if (art := artifacts()) is not None:  # the next GPU test can start from it (KRL_SFT_MODEL)
        shutil.copytree(out, art / "sft_hf", dirs_exist_ok=True)
    return {"model": out, "losses": losses, "sft_s": sft_s, "iteration": it, "env": env}


@pytest.mark.timeout(RUN_TIMEOUT_S + 900)
def test_sft_warm_start_writes_kernels(tmp_path: Path) -> None:
    missing = _needs()
    if missing:
        pytest.skip("needs " + "; ".join(missing))
    sft = warm_start(tmp_path)
    env, out, losses, it, sft_s = sft["env"], sft["model"], sft["losses"], sft["iteration"], sft["sft_s"]
    first, last = losses[min(losses)], losses[max(losses)]
    prompts = tmp_path / "sample_prompts.jsonl"
    _run([sys.executable, "-m", "tools.sample_prompts", "--out", str(prompts)], env)

    report = tmp_path / "eval"
    with sglang_server(out, tmp_path / "sglang.log") as url:
        _run([sys.executable, "-m", "tools.eval_model", "--prompts", str(prompts), "--out", str(report),
              "--backend", "sglang", "--url", url, "--tokenizer", str(out), "--model", "sft-hd64",
              "--problems", "relu,softmax", "--split", "all", "--allow-train", "-k", str(SAMPLES),
              "--max-turns", "1", "--max-context-len", "4096", "--eval-devices", first_gpu(), "--no-progress"],
             env, timeout=900)  # fmt: skip
    summary = json.loads((report / "summary.json").read_text())
    results = [json.loads(line) for line in (report / "results.jsonl").open()]
    turns = [r["turns"][0] for r in results if r.get("turns")]
    statuses = [t["status"] for t in turns]
    result: dict[str, Any] = {
        "sft_steps": len(losses),
        "sft_wall_s": round(sft_s, 1),
        "loss_first": first,
        "loss_last": last,
        "losses": losses,
        "checkpoint_iteration": it,
        "episodes": len(statuses),
        "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
        "compile_rate": sum(1 for t in turns if t["compiled"]) / max(1, len(turns)),
        "correct_rate": statuses.count("ok") / max(1, len(statuses)),
        "summary": summary,
    }
    print("SFT warm start:", json.dumps({k: v for k, v in result.items() if k not in ("losses", "summary")}))
    if (art := artifacts()) is not None:
        art.mkdir(parents=True, exist_ok=True)
        (art / "summary-sft.json").write_text(json.dumps(result, indent=1, default=str))
        shutil.copytree(report, art / "eval-sft", dirs_exist_ok=True)
    assert last < 0.1 * first, result
    assert statuses and result["compile_rate"] > 0, result
