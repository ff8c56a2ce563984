"""In-slime mode (slime_ext/slime_plugins/generate.py) and the rollout function's evaluation=True
path, called the way slime calls them, against the SGLang TEST DOUBLE (tests/sglang_double.py,
a tiny random Qwen3 on loopback, reached through args.sglang_router_ip/port as slime's router) and
the REAL eval server on CPU (conftest's `cpu_server`). Where a test needs specific kernels the
double answers SCRIPTED texts (labelled), with teacher-forced log-probs of the same model.
slime itself is the labelled TEST DOUBLE in tests/slime_double."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import httpx
import pytest
import torch
import yaml

from tests.slime_double import install

install()

from slime.observability.rollout_data_utils import validate_rollout_id_annotated  # noqa: E402
from slime.rollout.base_types import RolloutFnEvalOutput  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

from eval_server.samples import load_candidate, load_problem  # noqa: E402
from krl_common.service import running_service  # noqa: E402
from slime_ext.rollout.problems import PromptRecord, write_prompt_records  # noqa: E402
from slime_ext.slime_plugins.generate import generate, reward  # noqa: E402
from slime_ext.slime_plugins.reward_post import HOOK_PATH, post_process  # noqa: E402
from slime_ext.slime_plugins.rollout import generate_rollout  # noqa: E402
from slime_ext.slime_plugins.rollout_log import log_eval_rollout  # noqa: E402
from slime_ext.slime_plugins.samples import check_sample  # noqa: E402
from tests.sglang_double import SGLangDouble  # noqa: E402
from tests.tiny_qwen3 import tiny_model, tiny_tokenizer  # noqa: E402

pytestmark = pytest.mark.integration

TEMPERATURE = 0.7
F = "```"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tokenizer as a directory, loaded by the plug-in like slime's --hf-checkpoint."""
    path = tmp_path_factory.mktemp("hf")
    tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def double() -> Iterator[SGLangDouble]:
    d = SGLangDouble(tiny_model(), tiny_tokenizer(), seed=11)
    d.url = d.start()
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def reset_double(double: SGLangDouble) -> None:
    double.reset()


@pytest.fixture(scope="module")
def prompt_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "kb.jsonl"
    relu = load_problem("relu")
    records = [
        PromptRecord("kb_L1_relu", 1, "19_ReLU", "relu", relu, split="holdout"),
        PromptRecord("kb_L2_other", 2, "x", "other", relu + "\n# train copy\n", split="train"),
    ]
    write_prompt_records(path, records)
    return path


def slime_args(double: SGLangDouble, hf_dir: str, eval_url: str, episode: dict, **plugins) -> SimpleNamespace:
    parts = urlsplit(double.url)
    return SimpleNamespace(
        hf_checkpoint=hf_dir,
        sglang_router_ip=parts.hostname,
        sglang_router_port=parts.port,
        rollout_temperature=TEMPERATURE,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_max_context_len=4096,
        rollout_max_response_len=24,
        group_rm=False,
        router_policy=None,
        reward_key=None,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        kernel_rl={"episode": episode, "plugins": {"eval_urls": [eval_url], **plugins}},
    )


def sampling_params(max_new_tokens: int = 24) -> dict:
    """What slime's GenerateState passes (a per-sample copy)."""
    return {
        "temperature": TEMPERATURE, "top_p": 1.0, "top_k": -1, "max_new_tokens": max_new_tokens, "stop": None,
        "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }  # fmt: skip


def data_sample(index: int = 0) -> Sample:
    """As slime's Dataset builds it from the prompt jsonl with --input-key reference --label-key instance_id."""
    return Sample(
        group_index=0, index=index, prompt=load_problem("relu"), label="kb_L1_relu", session_id="s1"
    )


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_sampled_episode_token_exact_and_logprobs_match(double, hf_dir, cpu_server) -> None:
    args = slime_args(double, hf_dir, cpu_server, {"max_turns": 3})
    sample = asyncio.run(generate(args, data_sample(), sampling_params(16)))
    assert isinstance(sample, Sample) and sample.reward is not None
    check_sample(sample)
    prompt_len = len(sample.tokens) - sample.response_length
    response = sample.tokens[prompt_len:]
    runs = mask_runs(sample.loss_mask)
    assert len(runs) == len(double.outputs) == 3
    for (start, end), out, req in zip(runs, double.outputs, double.requests, strict=True):
        assert response[start:end] == out  # trained tokens are exactly the sampled ones
        assert req["input_ids"] == sample.tokens[: prompt_len + start]  # the engine saw the stored ids
        assert req["sampling_params"]["temperature"] == TEMPERATURE
    # rollout log-probs == a fresh forward pass of the same model on the stored tokens
    with torch.no_grad():
        logits = tiny_model()(input_ids=torch.tensor([sample.tokens])).logits[0].float()
    lp = torch.log_softmax(logits[prompt_len - 1 : -1] / TEMPERATURE, dim=-1)
    recomputed = lp[torch.arange(len(response)), torch.tensor(response)]
    got = torch.tensor(sample.rollout_log_probs)
    mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
    assert torch.allclose(got[mask], recomputed[mask], atol=1e-4)
    assert (got[~mask] == 0).all()
    meta = sample.metadata["kernel_rl"]
    assert meta["instance_id"] == "kb_L1_relu" and len(meta["turns"]) == 3
    assert asyncio.run(reward(args, sample)) == sample.reward


def test_per_turn_wrong_then_correct_relu(double, hf_dir, cpu_server, prompt_data) -> None:
    double.scripted.extend(  # SCRIPTED answers (labelled): a wrong kernel, then the correct one
        [
            f"<think>\nTry.\n</think>\n\n{F}python\n{load_candidate('relu__wrong_math')}\n{F}",
            f"Fixed.\n{F}python\n{load_candidate('relu__correct')}\n{F}",
        ]
    )
    episode = {"max_turns": 2, "reward": {"credit": "per_turn"}, "eval_options": {"correctness_trials": 2}}
    args = slime_args(double, hf_dir, cpu_server, episode, prompt_data=str(prompt_data))
    args.custom_reward_post_process_path = HOOK_PATH
    out = asyncio.run(generate(args, data_sample(index=5), sampling_params(4096)))
    assert isinstance(out, list) and len(out) == 2
    # CPU: no timing, so rewards 0.1 (compiled, wrong) and 0.3 (correct); G = [0.1 + 0.4 * 0.3, 0.3]
    assert [s.reward for s in out] == pytest.approx([0.22, 0.3])
    for t, s in enumerate(out):
        check_sample(s)
        assert (s.index, s.rollout_id, s.group_index) == (5, 5, 0)
        assert s.tokens[-s.response_length :] == double.outputs[t] and set(s.loss_mask) == {1}
        meta = s.metadata["kernel_rl"]
        assert meta["turn"] == t and meta["level"] == 1 and meta["problem_id"] == "19_ReLU"
        assert [x["status"] for x in meta["turns"]] == ["incorrect", "ok"]
    assert out[1].tokens[: len(out[0].tokens)] == out[0].tokens  # turn 2's context holds turn 1
    assert out[0].status == out[1].status == Sample.Status.COMPLETED
    validate_rollout_id_annotated([[out]])
    assert asyncio.run(reward(args, out)) == pytest.approx([0.22, 0.3])  # slime's batched RM call
    _, normalised = post_process(args, out)
    assert normalised == pytest.approx([-0.7071, 0.7071], abs=1e-3)


def test_aborted_generation_and_recycled_sample(double, hf_dir, cpu_server) -> None:
    args = slime_args(double, hf_dir, cpu_server, {"max_turns": 2})
    double.abort_next = True
    sample = asyncio.run(generate(args, data_sample(), sampling_params()))
    assert sample.status == Sample.Status.ABORTED and sample.remove_sample and sample.reward == 0.0
    assert sample.response_length == 1 and sample.loss_mask == [0]  # last prompt token, masked
    check_sample(sample)
    # slime recycles an aborted sample (partial rollout): generate starts it over from the prompt
    again = asyncio.run(generate(args, sample, sampling_params(8)))
    assert again.status != Sample.Status.ABORTED and not again.remove_sample
    assert double.requests[-2]["input_ids"] == double.requests[0]["input_ids"]
    check_sample(again)


def test_rollout_evaluation_path(double, hf_dir, cpu_server, prompt_data) -> None:
    double.scripted.append(f"{F}python\n{load_candidate('relu__correct')}\n{F}")  # SCRIPTED (labelled)
    episode = {"max_turns": 1, "eval_options": {"correctness_trials": 2}}
    args = slime_args(double, hf_dir, cpu_server, episode)
    args.eval_datasets = [
        SimpleNamespace(name="kb_holdout", path=str(prompt_data), n_samples_per_eval_prompt=1)
    ]
    args.eval_max_response_len = 4096
    out = generate_rollout(args, 0, None, evaluation=True)
    assert isinstance(out, RolloutFnEvalOutput)
    data = out.data["kb_holdout"]  # only the holdout record was run
    assert data["rewards"] == [pytest.approx(0.3)] and data["truncated"] == [False]
    (s,) = data["samples"]
    check_sample(s)
    assert s.label == "kb_L1_relu" and s.metadata["kernel_rl"]["level"] == 1
    assert len(double.requests) == 1 and out.metrics["eval/kb_holdout/aborted"] == 0
    extra: dict = {}
    assert log_eval_rollout(0, args, out.data, extra) is False
    assert extra["eval/kb_holdout/kernel/correct_rate"] == 1.0
    with pytest.raises(ValueError, match="--eval-prompt-data"):
        generate_rollout(slime_args(double, hf_dir, cpu_server, episode), 0, None, evaluation=True)


def test_buffer_mode_with_the_real_agent_runner(double, hf_dir, cpu_server, prompt_data, tmp_path) -> None:
    """End to end in buffer mode: the buffer server's REAL agent runner (--recipe) plays per_turn
    episodes against the SGLang double and the real eval server; the rollout function starts it,
    leases the group and converts the runner's records."""
    wrong = f"{F}python\n{load_candidate('relu__wrong_math')}\n{F}"
    correct = f"{F}python\n{load_candidate('relu__correct')}\n{F}"
    # SCRIPTED (labelled): episode 0 answers no code, then correct; episode 1 wrong, then correct
    double.scripted.extend(["No kernel yet.", correct, wrong, correct])
    episode = {
        "max_turns": 2,
        "eval_options": {"correctness_trials": 1},
        "reward": {"credit": "per_turn", "early_stop_min_speedup": None},
    }
    runner = {
        "prompt_data": str(prompt_data), "sglang_url": double.url, "eval_urls": cpu_server, "tokenizer": hf_dir,
        "concurrency": 1, "max_ready_groups": 1, "temperature": 1.0, "max_context_tokens": 8192,
        "max_new_tokens": 512, "run_id": "e2e", "epochs": 1,
    }  # fmt: skip
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"kernel_rl": {"runner": runner, "episode": episode}}), encoding="utf-8")
    buffer_args = ["--db", str(tmp_path / "b.sqlite"), "--group-size", "2", "--recipe", str(recipe)]
    with running_service("buffer_server", buffer_args, tmp_path, startup_timeout_s=120) as svc:
        args = SimpleNamespace(
            rollout_batch_size=1, n_samples_per_prompt=2, advantage_estimator="grpo", rewards_normalization=True,
            grpo_std_normalization=True, reward_key=None, custom_reward_post_process_path=HOOK_PATH,
            kernel_rl={"episode": episode, "plugins": {"buffer_url": svc.url, "batch_wait_s": 5, "max_wait_s": 300}},
        )  # fmt: skip
        try:
            out = generate_rollout(args, 0, None)
        finally:
            httpx.post(f"{svc.url}/rollout/stop", json={}, timeout=60)
    ((ep_a, ep_b),) = out.samples  # one group (the one train record), two trajectories of two turns
    validate_rollout_id_annotated(out.samples)
    # CPU rewards: no code 0, wrong 0.1, correct 0.3; G_0 = r_0 + 0.4 r_1
    returns = sorted([[s.reward for s in ep_a], [s.reward for s in ep_b]])
    assert returns == [pytest.approx([0.12, 0.3]), pytest.approx([0.22, 0.3])]
    sampled = {tuple(o) for o in double.outputs}
    for traj in (ep_a, ep_b):
        assert len({s.rollout_id for s in traj}) == 1
        for s in traj:
            check_sample(s)
            assert tuple(s.tokens[-s.response_length :]) in sampled  # exactly what the engine sampled
            assert s.label == "kb_L2_other" and s.metadata["kernel_rl"]["level"] == 2
        assert traj[1].tokens[: len(traj[0].tokens)] == traj[0].tokens
    _, normalised = post_process(args, [s for traj in (ep_a, ep_b) for s in traj])
    assert sum(normalised) == pytest.approx(0.0, abs=1e-5)
