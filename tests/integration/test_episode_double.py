"""run_episode against the SGLang TEST DOUBLE (tests/sglang_double.py) serving a tiny random
Qwen3 model on loopback, with a scripted stand-in for the eval client.

Checks token exactness (trained tokens are the sampled tokens, mask 1 exactly on them, lengths
agree), that the engine always receives exactly the stored ids, that rollout log-probs match a
fresh forward pass of the same model, and the statuses (truncated, aborted, eval outage).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from eval_server.samples import load_problem
from eval_server.schema import EvalResult
from slime_ext.clients.eval_client import EvalRequestError, EvalUnavailableError
from slime_ext.clients.sglang_client import SGLangClient
from slime_ext.rollout.chat import ChatRenderer
from slime_ext.rollout.episode import EpisodeConfig, episode_to_samples_per_turn, problem_fields, run_episode
from slime_ext.rollout.prompts import DEFAULT_NO_CODE_FEEDBACK
from slime_ext.rollout.rewards import RewardConfig
from tests.sglang_double import SGLangDouble
from tests.tiny_qwen3 import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.integration

TEMPERATURE = 0.7
F = "```"


class ScriptedEvaluator:
    """Stand-in for EvalClient: answers queued results (or raises queued exceptions)."""

    def __init__(self, results: list[Any]) -> None:
        self.results = list(results)
        self.calls: list[tuple[str, str]] = []
        self.backends: list[str | None] = []

    async def evaluate_source(self, reference: str, candidate: str, **kw: Any) -> EvalResult:
        self.calls.append((reference, candidate))
        self.backends.append(kw.get("backend"))
        item = self.results.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def double(tok) -> Iterator[SGLangDouble]:
    d = SGLangDouble(tiny_model(), tok, seed=7)
    d.url = d.start()
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def reset_double(double: SGLangDouble) -> None:
    double.reset()


def episode(double, tok, evaluator, *, max_context_len=4096, **cfg: Any):
    async def go():
        async with SGLangClient(double.url, temperature=TEMPERATURE, max_context_len=max_context_len) as sg:
            return await run_episode(
                {"reference": load_problem("relu"), "problem_id": "relu"},
                tokenizer=tok,
                sglang=sg,
                evaluator=evaluator,
                config=EpisodeConfig(**cfg),
            )

    return asyncio.run(go())


def assert_token_exact(ep, double) -> None:
    n = len(ep.response_ids)
    assert len(ep.loss_mask) == n == len(ep.rollout_log_probs)
    for t, turn in enumerate(ep.turns):
        # the engine received exactly the stored ids before this turn, and its answer is stored verbatim
        assert double.requests[t]["input_ids"] == ep.prompt_ids + ep.response_ids[: turn.start]
        assert ep.response_ids[turn.start : turn.end] == double.outputs[t]
    sampled = sorted(i for turn in ep.turns for i in range(turn.start, turn.end))
    assert [i for i, m in enumerate(ep.loss_mask) if m == 1] == sampled
    assert all(lp == 0.0 for lp, m in zip(ep.rollout_log_probs, ep.loss_mask, strict=True) if m == 0)
    ep.check()


def test_three_sampled_turns_token_exact(double, tok) -> None:
    ev = ScriptedEvaluator([])
    ep = episode(double, tok, ev, max_new_tokens_per_turn=24)
    assert len(ep.turns) == 3 and len(double.requests) == 3
    assert_token_exact(ep, double)
    assert ev.calls == []  # random model: no code block, nothing evaluated
    assert ep.rewards == [0.0, 0.0, 0.0]
    # between turns: (closing <|im_end|> if needed +) the no-code feedback user turn, mask 0
    r = ChatRenderer(tok)
    for a, b in zip(ep.turns, ep.turns[1:], strict=False):
        between = ep.response_ids[a.end : b.start]
        assert set(ep.loss_mask[a.end : b.start]) == {0}
        text = r.decode(between)
        assert DEFAULT_NO_CODE_FEEDBACK in text and text.endswith("<|im_start|>assistant\n")
    last = ep.turns[-1]
    assert ep.status == ("truncated" if last.finish_reason == "length" else "completed")
    assert ep.response_ids[-1] == double.outputs[-1][-1]  # nothing appended after the last turn


def test_cuda_backend_prompts_in_cuda_and_asks_for_a_cuda_evaluation(double, tok) -> None:
    double.scripted.extend([f"{F}python\nv1 = 1\n{F}", f"{F}python\nv2 = 2\n{F}"])
    ev = ScriptedEvaluator(
        [
            EvalResult(status="compile_error", feedback="nvcc: error (FEEDBACK-1)"),
            EvalResult(status="ok", correct=True, compiled=True),
        ]
    )
    ep = episode(double, tok, ev, backend="cuda", max_turns=2)
    assert ev.backends == ["cuda", "cuda"]
    first = ChatRenderer(tok).decode(double.requests[0]["input_ids"])
    assert "CUDA C++" in first and "load_inline" in first and "triton" not in first.lower()
    assert "FEEDBACK-1" in ep.messages[3]["content"] and "triton" not in ep.messages[3]["content"].lower()


def test_rollout_logprobs_match_forward_pass(double, tok) -> None:
    ep = episode(double, tok, ScriptedEvaluator([]), max_new_tokens_per_turn=16)
    tokens = torch.tensor([ep.tokens])
    with torch.no_grad():
        logits = tiny_model()(input_ids=tokens).logits[0].float()
    logp = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    p = len(ep.prompt_ids)
    checked = 0
    for i, (tid, lp, m) in enumerate(zip(ep.response_ids, ep.rollout_log_probs, ep.loss_mask, strict=True)):
        if m:
            assert abs(float(logp[p + i - 1, tid]) - lp) < 1e-4
            checked += 1
    assert checked == sum(ep.loss_mask) > 0


def test_scripted_turns_reward_and_early_stop(double, tok) -> None:
    double.scripted.extend(
        [f"try\n{F}python\nv1 = 1\n{F}", f"<think>\nhmm\n</think>\n{F}python\nv2 = 2\n{F}"]
    )
    ev = ScriptedEvaluator(
        [
            EvalResult(status="incorrect", compiled=True, feedback="Status: incorrect (FEEDBACK-1)"),
            EvalResult(status="ok", compiled=True, correct=True, speedup=2.5, feedback="fast"),
        ]
    )
    ep = episode(double, tok, ev)
    assert [c for _, c in ev.calls] == ["v1 = 1", "v2 = 2"]
    assert ep.rewards == pytest.approx([0.1, 1.8])
    assert ep.early_stopped and ep.status == "completed" and len(ep.turns) == 2
    assert ep.reward == pytest.approx(0.1 + 0.4 * 1.8)
    assert ep.returns == pytest.approx([0.1 + 0.4 * 1.8, 1.8])
    assert_token_exact(ep, double)
    assert "FEEDBACK-1" in ChatRenderer(tok).decode(ep.response_ids[ep.turns[0].end : ep.turns[1].start])
    assert ep.turns[0].eval_result["status"] == "incorrect"
    samples = episode_to_samples_per_turn(ep)
    assert [s.ret for s in samples] == pytest.approx(ep.returns)
    for s, turn in zip(samples, ep.turns, strict=True):
        assert s.prompt_ids + s.response_ids == ep.tokens[: len(ep.prompt_ids) + turn.end]
        assert s.response_ids == double.outputs[turn.index]
        assert set(s.loss_mask) == {1} and len(s.rollout_log_probs) == len(s.response_ids)


def test_length_stop_closed_with_untrained_end_token(double, tok) -> None:
    # turn 1 is cut by max_new_tokens (no <|im_end|>), turn 2 stops normally
    double.scripted.extend(["x " * 40, "short"])
    ev = ScriptedEvaluator([])
    ep = episode(double, tok, ev, max_turns=2, max_new_tokens_per_turn=8)
    t0, t1 = ep.turns
    assert t0.finish_reason == "length" and t0.end - t0.start == 8
    end_id = ChatRenderer(tok).end_of_turn_id
    assert ep.response_ids[t0.end] == end_id and ep.loss_mask[t0.end] == 0
    assert t1.finish_reason == "stop" and ep.status == "completed"
    assert_token_exact(ep, double)


def test_length_on_last_turn_is_truncated(double, tok) -> None:
    double.scripted.append("y " * 40)
    ep = episode(double, tok, ScriptedEvaluator([]), max_turns=1, max_new_tokens_per_turn=5)
    assert ep.status == "truncated" and len(ep.response_ids) == 5


def prompt_len(tok) -> int:
    from slime_ext.rollout.prompts import build_messages

    return len(ChatRenderer(tok).prompt_ids(build_messages(load_problem("relu"))))


def test_context_budget_clamps_and_truncates(double, tok) -> None:
    # room for the prompt and 6 tokens: the first call is clamped to 6, then nothing is left
    double.scripted.append("w " * 200)
    ep = episode(double, tok, ScriptedEvaluator([]), max_context_len=prompt_len(tok) + 6)
    assert ep.status == "truncated" and len(ep.turns) == 1 and len(ep.response_ids) == 6
    assert double.requests[0]["sampling_params"]["max_new_tokens"] == 6
    assert_token_exact(ep, double)


def test_no_room_for_feedback_truncates(double, tok) -> None:
    double.scripted.append("short")
    n_out = len(tok.encode("short", add_special_tokens=False)) + 1
    ep = episode(double, tok, ScriptedEvaluator([]), max_context_len=prompt_len(tok) + n_out + 3)
    assert ep.turns[0].finish_reason == "stop" and len(ep.turns) == 1
    assert ep.status == "truncated" and len(ep.response_ids) == n_out  # feedback not appended
    assert_token_exact(ep, double)


def test_no_budget_at_all(double, tok) -> None:
    ep = episode(double, tok, ScriptedEvaluator([]), max_context_len=prompt_len(tok))
    assert ep.status == "truncated" and ep.turns == [] and ep.response_ids == [] and double.requests == []
    assert ep.reward == 0.0


def test_engine_abort(double, tok) -> None:
    double.abort_next = True
    ep = episode(double, tok, ScriptedEvaluator([]))
    assert ep.status == "aborted" and "aborted" in ep.abort_reason and len(ep.turns) == 1


def test_eval_outage_aborts_episode(double, tok) -> None:
    double.scripted.append(f"{F}python\nv = 1\n{F}")
    ev = ScriptedEvaluator([EvalUnavailableError("no eval server accepted the request")])
    ep = episode(double, tok, ev)
    assert ep.status == "aborted" and "EvalUnavailableError" in ep.abort_reason
    assert len(ep.turns) == 1 and ep.rewards == [0.0]
    ep.check()


def test_evaluator_side_status_aborts(double, tok) -> None:
    double.scripted.append(f"{F}python\nv = 1\n{F}")
    ev = ScriptedEvaluator([EvalResult(status="reference_error", feedback="broken problem")])
    ep = episode(double, tok, ev)
    assert ep.status == "aborted" and "reference_error" in ep.abort_reason


def test_per_turn_credit_mode(double, tok) -> None:
    double.scripted.extend([f"{F}python\na = 1\n{F}"] * 3)
    results = [EvalResult(status="incorrect", compiled=True, feedback="no")] * 2
    results.append(EvalResult(status="ok", compiled=True, correct=True, feedback="yes"))
    ep = episode(double, tok, ScriptedEvaluator(results), reward=RewardConfig(credit="per_turn"))
    assert ep.rewards == pytest.approx([0.1, 0.1, 0.3])
    assert ep.returns == pytest.approx([0.1 + 0.4 * 0.1 + 0.16 * 0.3, 0.1 + 0.4 * 0.3, 0.3])
    assert ep.credit == "per_turn" and not ep.early_stopped
    assert len(episode_to_samples_per_turn(ep)) == 3


def test_eval_request_error_is_the_candidates_fault(double, tok) -> None:
    double.scripted.extend([f"{F}python\nv = 1\n{F}", "no code"])
    ev = ScriptedEvaluator([EvalRequestError("candidate: longer than 200000 characters", status_code=413)])
    ep = episode(double, tok, ev, max_turns=2)
    assert ep.status == "completed" and ep.rewards == [0.0, 0.0]
    assert ep.turns[0].eval_error and ep.turns[0].eval_result is None
    fb = ChatRenderer(tok).decode(ep.response_ids[ep.turns[0].end : ep.turns[1].start])
    assert "longer than 200000 characters" in fb


def test_episode_json_and_problem_forms(double, tok) -> None:
    double.scripted.append("nothing")
    ep = episode(double, tok, ScriptedEvaluator([]), max_turns=1)
    data = json.loads(json.dumps(ep.to_json()))
    assert data["status"] == "completed" and data["problem_id"] == "relu"
    assert data["turns"][0]["start"] == 0 and set(data["timing"]) == {"total_s", "generate_s", "eval_s"}
    ref = load_problem("relu")
    assert problem_fields(ref) == (ref, None)
    assert problem_fields({"reference": ref, "instance_id": 7}) == (ref, "7")
    with pytest.raises(ValueError):
        problem_fields({"reference": ""})


def test_thinking_off_and_concurrent_episodes(double, tok) -> None:
    """Four episodes at once through one client, rendered with enable_thinking=False: every
    generation prompt (first and after feedback) ends with the empty think block."""

    async def go():
        async with SGLangClient(double.url, temperature=TEMPERATURE, max_context_len=4096) as sg:
            cfg = EpisodeConfig(max_turns=2, max_new_tokens_per_turn=6, enable_thinking=False)
            return await asyncio.gather(
                *(
                    run_episode(
                        load_problem(name),
                        tokenizer=tok,
                        sglang=sg,
                        evaluator=ScriptedEvaluator([]),
                        config=cfg,
                    )
                    for name in ("relu", "softmax", "matmul", "sum_dim")
                )
            )

    episodes = asyncio.run(go())
    r = ChatRenderer(tok)
    assert len(double.requests) == 8
    sent = [tuple(req["input_ids"]) for req in double.requests]
    for ep in episodes:
        assert r.decode(ep.prompt_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        t0, t1 = ep.turns
        assert r.decode(ep.response_ids[t0.end : t1.start]).endswith("assistant\n<think>\n\n</think>\n\n")
        assert tuple(ep.prompt_ids) in sent and tuple(ep.tokens[: len(ep.prompt_ids) + t1.start]) in sent
        ep.check()


def test_roles_follow_the_outcomes_and_their_wording_reaches_the_model(double, tok) -> None:
    """Turn 0 is the generator; after an incorrect kernel the fixer, after a correct one the
    optimizer; each handover message carries the role's preamble and instruction from the recipe."""
    from slime_ext.rollout.prompts import PromptConfig
    from slime_ext.rollout.roles import RolePrompt

    double.scripted.extend([f"{F}python\nv1 = 1\n{F}", f"{F}python\nv2 = 2\n{F}", f"{F}python\nv3 = 3\n{F}"])
    ev = ScriptedEvaluator(
        [
            EvalResult(status="incorrect", compiled=True, feedback="Status: incorrect."),
            EvalResult(status="ok", compiled=True, correct=True, speedup=0.8, feedback="Status: ok, slower."),
            EvalResult(status="ok", compiled=True, correct=True, speedup=1.3, feedback="Status: ok."),
        ]
    )
    prompt = PromptConfig(
        roles={
            "fixer": RolePrompt(preamble="FIXER-ROLE", instruction="FIX-IT"),
            "optimizer": RolePrompt(preamble="OPTIMIZER-ROLE"),
        }
    )
    ep = episode(double, tok, ev, prompt=prompt, max_turns=3, reward=RewardConfig(early_stop_min_speedup=5.0))
    assert [t.role for t in ep.turns] == ["generator", "fixer", "optimizer"]
    users = [m["content"] for m in ep.messages if m["role"] == "user"]
    to_fixer, to_optimizer = users[1], users[2]
    assert to_fixer.startswith("FIXER-ROLE") and to_fixer.endswith("FIX-IT")
    assert to_optimizer.startswith("OPTIMIZER-ROLE") and to_optimizer.endswith(PromptConfig().faster_instruction)
    assert_token_exact(ep, double)
