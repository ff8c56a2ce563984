"""The multi-turn episode: one async function shared by the buffer's agent runner and the
in-slime custom generate plug-in.

    generate -> extract candidate -> evaluate -> turn reward -> early stop? -> feedback turn -> ...

Token bookkeeping (see `slime_ext/rollout/chat.py` for the rendering rule):
- `prompt_ids`: the rendered system + first user message, with the generation prompt.
- `response_ids`: everything after the prompt, all turns: the sampled tokens of each turn
  (loss_mask 1, their sampled log-probs), then, when another turn follows, the closing
  `<|im_end|>` if the model did not emit it and the feedback user turn's delta tokens (loss_mask 0,
  log-prob 0.0).
- `turns[t].start` / `.end`: offsets into `response_ids` of turn t's sampled span.

Statuses:
- `completed`: the last turn ended normally (early stop, or `max_turns` reached).
- `truncated`: the context budget ran out (no room for the next turn or its feedback), or the
  last generated turn finished with `length`.
- `aborted`: the engine aborted a generation, or the evaluation could not be done (eval server
  unavailable or too slow, evaluator-side statuses `reference_error` / `server_error` /
  `unsupported`).
  `abort_reason` says why. Retry policy: the EvalClient already retries connection failures and
  full queues (with backoff); the episode does not retry on top of it, so an outage ends the
  episode promptly as `aborted` (slime then drops it) instead of holding a rollout slot.
  A 4xx from the eval server (e.g. a candidate over the size limit) is the candidate's fault: the
  turn gets reward 0 and the error text as feedback.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from eval_server.schema import (
    EVALUATOR_STATUSES,
    EvalOptions,
    EvalResult,
)
from slime_ext.clients.backends import DEFAULT_BACKEND, check_backend
from slime_ext.clients.eval_client import EvalClient, EvalClientError, EvalRequestError
from slime_ext.clients.sglang_client import FINISH_ABORT, FINISH_LENGTH, SGLangClient
from slime_ext.rollout.candidate import extract_candidate
from slime_ext.rollout.chat import ChatRenderer
from slime_ext.rollout.prompts import (
    PromptConfig,
    build_messages,
    default_prompt,
    feedback_message,
    no_code_feedback,
    refused_feedback,
)
from slime_ext.rollout.rewards import (
    RewardConfig,
    discounted_returns,
    should_stop,
    trajectory_return,
    turn_reward,
)
from slime_ext.rollout.roles import FIXER, GENERATOR, role_after
from slime_ext.trajectory.record import STATUS_ABORTED, STATUS_COMPLETED, STATUS_TRUNCATED

__all__ = [
    "EPISODE_STATUSES",
    "Episode",
    "EpisodeConfig",
    "Turn",
    "TurnSample",
    "TurnStep",
    "episode_to_samples_per_turn",
    "evaluate_response",
    "problem_fields",
    "run_episode",
]

# One definition of the statuses: the trajectory record's (the episode becomes such a record).
EPISODE_STATUSES = (STATUS_COMPLETED, STATUS_TRUNCATED, STATUS_ABORTED)


@dataclass(frozen=True)
class EpisodeConfig:
    max_turns: int = 3
    max_new_tokens_per_turn: int | None = None  # None: the SGLang client's default
    backend: str = DEFAULT_BACKEND  # kernel language (slime_ext/clients/backends.py): prompts + eval request
    # None: default_prompt(backend), set on construction (so replace(config, backend=...) keeps
    # the old wording unless it also passes prompt=None)
    prompt: PromptConfig | None = None
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval_options: EvalOptions = field(default_factory=EvalOptions)
    enable_thinking: bool | None = None  # passed to the chat template (None: template default)
    end_of_turn: str = "<|im_end|>"
    chat_template_kwargs: Mapping[str, Any] | None = None
    # Evaluator-side statuses (not the candidate's fault): the episode is aborted, not scored.
    abort_on_eval_statuses: tuple[str, ...] = EVALUATOR_STATUSES

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError("max_turns must be >= 1")
        check_backend(self.backend, "backend")
        if self.reward.baseline == "compile" and not self.eval_options.baseline_compile:
            # the rewarded speedup needs the compiled baseline: the request asks for it
            object.__setattr__(self, "eval_options", replace(self.eval_options, baseline_compile=True))
        if self.prompt is None:
            object.__setattr__(self, "prompt", default_prompt(self.backend))


@dataclass
class Turn:
    index: int
    start: int  # offset in Episode.response_ids of the first sampled token of this turn
    end: int  # offset just past the last sampled token
    finish_reason: str
    text: str = ""  # decoded sampled tokens (for logs; never re-tokenized)
    candidate: str | None = None
    eval_result: dict[str, Any] | None = None  # EvalResult.to_json(), None when nothing evaluated
    eval_error: str | None = None  # a 4xx from the eval server
    reward: float = 0.0
    gen_s: float = 0.0
    eval_s: float = 0.0
    role: str = GENERATOR  # roles.py: generator (turn 0), then fixer or optimizer by the turn before


@dataclass
class Episode:
    problem_id: str | None
    messages: list[dict[str, str]]  # the chat as text (for logs); assistant contents are decoded
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    status: str = STATUS_COMPLETED
    abort_reason: str | None = None
    early_stopped: bool = False
    gamma: float = 0.4
    credit: str = "trajectory"
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.turns]

    @property
    def returns(self) -> list[float]:
        """G_t per turn (per_turn credit)."""
        return discounted_returns(self.rewards, self.gamma)

    @property
    def reward(self) -> float:
        """The trajectory return sum_t gamma^t r_t (trajectory credit)."""
        return trajectory_return(self.rewards, self.gamma)

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def check(self) -> None:
        """Assert the Sample invariants: equal lengths, mask 1 exactly on the sampled spans."""
        n = len(self.response_ids)
        if not (len(self.loss_mask) == n == len(self.rollout_log_probs)):
            raise AssertionError(
                f"lengths differ: response {n}, mask {len(self.loss_mask)}, logprobs {len(self.rollout_log_probs)}"
            )
        sampled = [0] * n
        for t in self.turns:
            for i in range(t.start, t.end):
                sampled[i] = 1
        if sampled != self.loss_mask:
            raise AssertionError("loss_mask is not 1 exactly on the sampled spans")
        if any(lp != 0.0 for lp, m in zip(self.rollout_log_probs, self.loss_mask, strict=True) if m == 0):
            raise AssertionError("masked tokens must have log-prob 0.0")

    def to_json(self) -> dict[str, Any]:
        return {
            "problem_id": self.problem_id,
            "messages": self.messages,
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "loss_mask": self.loss_mask,
            "rollout_log_probs": self.rollout_log_probs,
            "turns": [vars(t).copy() for t in self.turns],
            "rewards": self.rewards,
            "returns": self.returns,
            "reward": self.reward,
            "status": self.status,
            "abort_reason": self.abort_reason,
            "early_stopped": self.early_stopped,
            "gamma": self.gamma,
            "credit": self.credit,
            "timing": self.timing,
        }


@dataclass
class TurnSample:
    """One training sample of per_turn credit: the context before the turn, the turn's sampled
    tokens, their mask (all 1) and log-probs, and the turn's discounted return G_t."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_log_probs: list[float]
    ret: float
    turn: int


def problem_fields(problem: Any) -> tuple[str, str | None]:
    """(reference source, problem id) from a source string, a prompt record or an object."""
    if isinstance(problem, str):
        return problem, None
    if isinstance(problem, Mapping):
        ref = problem.get("reference")
        pid = problem.get("problem_id") or problem.get("instance_id") or problem.get("name")
    else:
        ref = getattr(problem, "reference", None)
        pid = getattr(problem, "problem_id", None) or getattr(problem, "instance_id", None)
    if not isinstance(ref, str) or not ref.strip():
        raise ValueError("problem has no reference source")
    return ref, None if pid is None else str(pid)


class _Builder:
    """Appends tokens while keeping response ids, mask and log-probs the same length."""

    def __init__(self, episode: Episode) -> None:
        self.ep = episode

    def sampled(self, ids: Sequence[int], logprobs: Sequence[float]) -> tuple[int, int]:
        if len(ids) != len(logprobs):
            raise ValueError("sampled ids and log-probs differ in length")
        start = len(self.ep.response_ids)
        self.ep.response_ids.extend(int(t) for t in ids)
        self.ep.loss_mask.extend([1] * len(ids))
        self.ep.rollout_log_probs.extend(float(x) for x in logprobs)
        return start, len(self.ep.response_ids)

    def context(self, ids: Sequence[int]) -> None:
        self.ep.response_ids.extend(int(t) for t in ids)
        self.ep.loss_mask.extend([0] * len(ids))
        self.ep.rollout_log_probs.extend([0.0] * len(ids))


@dataclass
class TurnStep:
    """What one response leads to: the candidate, its evaluation, the turn reward, and either the
    next user message, an early stop, or an abort (`abort_reason` set: the episode ends unscored)."""

    candidate: str | None = None
    eval_result: dict[str, Any] | None = None
    eval_error: str | None = None
    eval_s: float = 0.0
    reward: float = 0.0
    stop: bool = False
    abort_reason: str | None = None
    next_message: dict[str, str] = field(default_factory=dict)
    next_role: str = FIXER  # the role next_message hands the next turn to (roles.role_after)

    def record(self, turn: Any) -> None:
        """Copy the outcome onto a turn record (`Turn`, or the chat loop's turn); an aborted
        step leaves the turn's reward at 0."""
        turn.candidate, turn.eval_error, turn.eval_result = self.candidate, self.eval_error, self.eval_result
        turn.eval_s = self.eval_s
        if self.abort_reason is None:
            turn.reward = self.reward


async def evaluate_response(
    visible_text: str,
    reference: str,
    problem_id: str | None,
    evaluator: EvalClient,
    config: EpisodeConfig,
) -> TurnStep:
    """Extract, evaluate and score one response (its visible text: no end-of-turn token).

    Shared by the token-level episode below and the text-level loop of the chat-endpoint policy
    (`slime_ext/reports/chat_policy.py`), so both apply the same extraction, eval-error handling,
    reward, early-stop rule and feedback wording.
    """
    step = TurnStep(candidate=extract_candidate(visible_text))
    result: EvalResult | None = None
    if step.candidate is None:
        step.next_message = no_code_feedback(config.prompt)
    else:
        eval_started = time.monotonic()
        try:
            result = await evaluator.evaluate_source(
                reference,
                step.candidate,
                options=config.eval_options,
                problem_id=problem_id,
                backend=config.backend,
            )
        except EvalRequestError as exc:
            step.eval_error = exc.message
            step.next_message = refused_feedback(exc.message, config.prompt)
        except EvalClientError as exc:  # unavailable, timeout, unexpected answer
            step.eval_s = time.monotonic() - eval_started
            step.abort_reason = f"evaluation failed ({type(exc).__name__}): {exc.message}"
            return step
        step.eval_s = time.monotonic() - eval_started
        if result is not None:
            step.eval_result = result.to_json()
            if result.status in config.abort_on_eval_statuses:
                step.abort_reason = f"evaluator-side failure: status {result.status}"
                return step
            step.next_message = feedback_message(result, config.prompt)
            step.next_role = role_after(result)
    step.reward = turn_reward(result, config.reward)
    step.stop = should_stop(result, config.reward)
    return step


async def run_episode(
    problem: Any,
    *,
    tokenizer: Any,
    sglang: SGLangClient,
    evaluator: EvalClient,
    config: EpisodeConfig | None = None,
    renderer: ChatRenderer | None = None,
    request_headers: Mapping[str, str] | None = None,
) -> Episode:
    """Run one multi-turn episode on a problem (reference source, prompt record or object).

    `renderer` may be passed to reuse one across episodes (it must wrap `tokenizer`);
    `request_headers` go with every generate call (e.g. a routing key for cache affinity).
    Engine errors other than abort (SGLangError) propagate: the caller decides about retries.
    """
    config = config or EpisodeConfig()
    renderer = renderer or ChatRenderer(
        tokenizer,
        enable_thinking=config.enable_thinking,
        end_of_turn=config.end_of_turn,
        chat_template_kwargs=config.chat_template_kwargs,
    )
    reference, problem_id = problem_fields(problem)
    started = time.monotonic()
    messages = build_messages(reference, config.prompt)
    ep = Episode(
        problem_id=problem_id,
        messages=[dict(m) for m in messages],
        prompt_ids=renderer.prompt_ids(messages),
        gamma=config.reward.gamma,
        credit=config.reward.credit,
    )
    build = _Builder(ep)
    gen_total = eval_total = 0.0
    role = GENERATOR

    for t in range(config.max_turns):
        n_context = len(ep.prompt_ids) + len(ep.response_ids)
        if sglang.budget(n_context) <= 0:
            ep.status = STATUS_TRUNCATED
            break
        gen = await sglang.generate(
            ep.prompt_ids + ep.response_ids,
            max_new_tokens=config.max_new_tokens_per_turn,
            headers=request_headers,
        )
        gen_total += gen.latency_s
        start, end = build.sampled(gen.token_ids, gen.logprobs)
        text = renderer.decode(gen.token_ids)
        turn = Turn(
            index=t, start=start, end=end, finish_reason=gen.finish_reason, text=text, gen_s=gen.latency_s,
            role=role,
        )  # fmt: skip
        ep.turns.append(turn)
        ep.messages.append({"role": "assistant", "content": text})
        if gen.finish_reason == FINISH_ABORT:
            ep.status, ep.abort_reason = STATUS_ABORTED, "generation aborted by the engine"
            break

        # The sampled text ends with the end-of-turn token when the model stopped on it.
        visible = text[: -len(renderer.end_of_turn)] if text.endswith(renderer.end_of_turn) else text
        step = await evaluate_response(visible, reference, problem_id, evaluator, config)
        step.record(turn)
        eval_total += step.eval_s
        if step.abort_reason is not None:
            ep.status, ep.abort_reason = STATUS_ABORTED, step.abort_reason
            break
        if step.stop:
            ep.early_stopped = True
            break
        next_message = step.next_message
        if t + 1 >= config.max_turns:
            if gen.finish_reason == FINISH_LENGTH:
                ep.status = STATUS_TRUNCATED
            break
        # Another turn follows: close this one (if needed) and append the feedback user turn.
        extra = renderer.closing_ids(gen.token_ids) + renderer.delta_ids([next_message])
        if sglang.budget(len(ep.prompt_ids) + len(ep.response_ids) + len(extra)) <= 0:
            ep.status = STATUS_TRUNCATED
            break
        build.context(extra)
        ep.messages.append(next_message)
        role = step.next_role

    ep.check()
    ep.timing = {"total_s": time.monotonic() - started, "generate_s": gen_total, "eval_s": eval_total}
    return ep


def episode_to_samples_per_turn(ep: Episode) -> list[TurnSample]:
    """Per-turn samples for per_turn credit: turn t's context is the prompt plus every response
    token before its sampled span (earlier turns and feedback, as context), its response is its
    sampled span only, and its return is G_t."""
    returns = ep.returns
    samples = []
    for turn, ret in zip(ep.turns, returns, strict=True):
        samples.append(
            TurnSample(
                prompt_ids=ep.prompt_ids + ep.response_ids[: turn.start],
                response_ids=ep.response_ids[turn.start : turn.end],
                loss_mask=ep.loss_mask[turn.start : turn.end],
                rollout_log_probs=ep.rollout_log_probs[turn.start : turn.end],
                ret=ret,
                turn=turn.index,
            )
        )
    return samples
