"""run_episode end to end against the REAL eval server (CPU, Triton interpreter) and the SGLang
TEST DOUBLE in scripted mode: turn 1 answers a wrong ReLU kernel, turn 2 the correct one."""

from __future__ import annotations

import asyncio

import pytest

from eval_server.samples import load_candidate, load_problem
from eval_server.schema import EvalOptions
from slime_ext.clients.eval_client import EvalClient
from slime_ext.clients.sglang_client import SGLangClient
from slime_ext.rollout.chat import ChatRenderer
from slime_ext.rollout.episode import EpisodeConfig, run_episode
from tests.sglang_double import SGLangDouble
from tests.tiny_qwen3 import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.integration

F = "```"


def test_wrong_then_correct_relu(cpu_server: str) -> None:
    tok = tiny_tokenizer()
    double = SGLangDouble(tiny_model(), tok, seed=3)
    url = double.start()
    double.scripted.extend(
        [
            f"<think>\nFirst attempt.\n</think>\n\n{F}python\n{load_candidate('relu__wrong_math')}\n{F}",
            f"Fixed the math.\n{F}python\n{load_candidate('relu__correct')}\n{F}",
        ]
    )

    async def go():
        async with (
            SGLangClient(url, temperature=1.0, max_context_len=16384) as sg,
            EvalClient(cpu_server, timeout_s=300) as ev,
        ):
            return await run_episode(
                {"reference": load_problem("relu"), "problem_id": "relu"},
                tokenizer=tok,
                sglang=sg,
                evaluator=ev,
                config=EpisodeConfig(max_turns=2, eval_options=EvalOptions(correctness_trials=2)),
            )

    try:
        ep = asyncio.run(go())
    finally:
        double.stop()

    statuses = [t.eval_result["status"] for t in ep.turns]
    assert statuses == ["incorrect", "ok"], [t.eval_result["feedback"] for t in ep.turns]
    assert ep.rewards == pytest.approx([0.1, 0.3])  # CPU: no timing, no speedup bonus
    assert not ep.early_stopped and ep.status == "completed"
    assert ep.reward == pytest.approx(0.1 + 0.4 * 0.3)
    assert ep.turns[1].candidate == load_candidate("relu__correct").strip("\n")

    # the feedback turn sits between the two sampled spans, untrained
    t0, t1 = ep.turns
    between = ep.response_ids[t0.end : t1.start]
    assert between and set(ep.loss_mask[t0.end : t1.start]) == {0}
    assert set(ep.rollout_log_probs[t0.end : t1.start]) == {0.0}
    feedback = ChatRenderer(tok).decode(between)
    assert ep.turns[0].eval_result["feedback"].strip()[:40] in feedback
    assert "Fix the problem" in feedback
    # trained tokens are exactly what the engine returned
    assert ep.response_ids[t0.start : t0.end] == double.outputs[0]
    assert ep.response_ids[t1.start : t1.end] == double.outputs[1]
    assert sum(ep.loss_mask) == len(double.outputs[0]) + len(double.outputs[1])
    ep.check()
