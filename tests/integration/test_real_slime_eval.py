"""Evaluation under `--eval-interval` through slime's REAL code (tests/real_slime.py; skipped
without slime's source), in both modes: slime's own `RolloutManager.eval` (built in-process)
calls the eval function and logs its output through our eval-log hook (`log_eval_rollout_data`).

- in-slime mode: the eval function is slime's default (`sglang_rollout.generate_rollout`), whose
  `eval_rollout` reads `--eval-prompt-data` with slime's Dataset and calls our custom generate
  per eval sample; those samples carry `index` but no `group_index`.
- buffer mode: the eval function is our rollout function (`--eval-function-path` defaults to
  `--rollout-function-path`), given slime's own eval dataset configs.

The engine is the SGLang TEST DOUBLE (tests/sglang_double.py, a tiny random Qwen3, SCRIPTED to
answer a correct ReLU kernel) reached as slime's router; the eval server is the REAL one on CPU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from eval_server.samples import load_candidate, load_problem
from slime_ext.rollout.problems import PromptRecord, write_prompt_records
from tests.real_slime import real_slime, record_logs, rollout_manager, slime_args
from tests.sglang_double import SGLangDouble
from tests.tiny_qwen3 import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.integration

F = "```"
CORRECT = f"{F}python\n{load_candidate('relu__correct')}\n{F}"
PLUGINS = "slime_ext.slime_plugins"


@pytest.fixture(scope="module")
def slime() -> Iterator[None]:
    with real_slime():
        yield


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("hf")
    tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def double(slime: None) -> Iterator[SGLangDouble]:
    d = SGLangDouble(tiny_model(), tiny_tokenizer(), seed=5)
    d.url = d.start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`holdout`: one holdout record (slime's own eval reads every record of its file);
    `mixed`: a train and a holdout record (our buffer-mode eval keeps the holdout one)."""
    tmp = tmp_path_factory.mktemp("data")
    relu = load_problem("relu")
    holdout = PromptRecord("kb_L1_relu", 1, "19_ReLU", "relu", relu, split="holdout")
    train = PromptRecord("kb_L2_other", 2, "x", "other", relu + "\n# train copy\n", split="train")
    write_prompt_records(tmp / "holdout.jsonl", [holdout])
    write_prompt_records(tmp / "mixed.jsonl", [train, holdout])
    return {"holdout": tmp / "holdout.jsonl", "mixed": tmp / "mixed.jsonl"}


def _args(
    tmp_path: Path, double: SGLangDouble, hf_dir: str, eval_url: str, mode: list[str], data: Path
) -> Any:
    recipe = tmp_path / "recipe.yaml"
    episode = {"max_turns": 1, "eval_options": {"correctness_trials": 2}}
    recipe.write_text(
        yaml.safe_dump({"kernel_rl": {"episode": episode, "plugins": {"eval_urls": [eval_url]}}})
    )
    argv = [
        *mode,
        "--custom-config-path", str(recipe),
        "--custom-eval-rollout-log-function-path", f"{PLUGINS}.rollout_log.log_eval_rollout",
        "--hf-checkpoint", hf_dir,
        "--prompt-data", str(data), "--input-key", "reference", "--label-key", "instance_id",
        "--rollout-batch-size", "1", "--num-rollout", "2", "--rollout-temperature", "0.7",
        "--rollout-max-context-len", "4096", "--rollout-num-gpus", "1",
        "--eval-interval", "1", "--eval-prompt-data", "kb", str(data), "--n-samples-per-eval-prompt", "1",
        "--eval-max-response-len", "4096",
    ]  # fmt: skip
    router = urlsplit(double.url)
    return slime_args(argv, sglang_router_ip=router.hostname, sglang_router_port=router.port)


def _check_eval(calls: list[dict[str, Any]], double: SGLangDouble, *, log_calls: int) -> None:
    """`log_calls`: 1 when the eval function returns metrics (our hook adds the kernel metrics to
    them, slime logs once), 2 when it returns none (slime's eval_rollout: our hook logs the kernel
    metrics itself at the same eval/step, then slime logs its own)."""
    assert len(calls) == log_calls and len({c["eval/step"] for c in calls}) == 1
    logged = {k: v for c in calls for k, v in c.items()}
    assert logged["eval/kb"] == pytest.approx(0.3)  # CPU: compiled and correct, no timing
    assert logged["eval/kb/kernel/correct_rate"] == 1.0 and logged["eval/kb/kernel/trajectories"] == 1
    assert logged["eval/kb-truncated_ratio"] == 0.0 and logged["eval/step"] == 3
    (request,) = double.requests  # the holdout problem only, once
    assert request["sampling_params"]["temperature"] == 0.7


def test_in_slime_mode_eval(slime, double, hf_dir, cpu_server, prompts, tmp_path, monkeypatch) -> None:
    double.reset()
    double.scripted.append(CORRECT)  # SCRIPTED (labelled)
    mode = ["--custom-generate-function-path", f"{PLUGINS}.generate.generate",
            "--custom-rm-path", f"{PLUGINS}.generate.reward"]  # fmt: skip
    args = _args(tmp_path, double, hf_dir, cpu_server, mode, prompts["holdout"])
    assert args.eval_function_path == "slime.rollout.sglang_rollout.generate_rollout"  # slime's own
    calls = record_logs(monkeypatch)
    rollout_manager(args).eval(rollout_id=3)
    _check_eval(calls, double, log_calls=2)


def test_buffer_mode_eval(slime, double, hf_dir, cpu_server, prompts, tmp_path, monkeypatch) -> None:
    double.reset()
    double.scripted.append(CORRECT)  # SCRIPTED (labelled)
    mode = ["--rollout-function-path", f"{PLUGINS}.rollout.generate_rollout"]
    args = _args(tmp_path, double, hf_dir, cpu_server, mode, prompts["mixed"])
    assert args.eval_function_path == f"{PLUGINS}.rollout.generate_rollout"
    calls = record_logs(monkeypatch)
    rollout_manager(args).eval(rollout_id=3)
    _check_eval(calls, double, log_calls=1)
    assert calls[0]["eval/kb/episodes"] == 1.0 and calls[0]["eval/kb/aborted"] == 0.0
