"""An OpenAI-compatible chat endpoint as the policy of an evaluation: the client and a text-level
multi-turn loop.

Served models are often reachable only through `/v1/chat/completions` (SGLang's and vLLM's
OpenAI servers, hosted APIs). There are no token ids or log-probs here, so this loop is for
evaluation only (never training): it keeps the conversation as text and lets the server apply the
chat template. Everything else is the episode's: the prompt builder, candidate extraction, eval
client, rewards, early stop and feedback messages come from `slime_ext.rollout.episode.evaluate_response`
and `slime_ext.rollout.prompts`, so both backends score a response the same way.

HTTP contract: `POST {base}/chat/completions` with `{"model", "messages", "temperature",
"max_tokens", "top_p"?, "seed"?, "chat_template_kwargs"?, ...extra}`; the answer's
`choices[0].message.content` (and `reasoning_content` when the server separates reasoning) and
`choices[0].finish_reason` (`stop`, `length`, ...; `abort` from SGLang). `chat_template_kwargs`
(e.g. `{"enable_thinking": false}`) is an SGLang/vLLM extension, sent only when set.
Retries: connection failures, 429 and 502/503/504 (with the server's Retry-After), with jittered
exponential backoff; a read timeout is not retried (the server may still be generating).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from krl_common.backoff import backoff_delay
from slime_ext.clients.eval_client import EvalClient
from slime_ext.clients.sglang_client import FINISH_ABORT, FINISH_LENGTH
from slime_ext.rollout.episode import EpisodeConfig, evaluate_response, problem_fields
from slime_ext.rollout.prompts import build_messages
from slime_ext.rollout.roles import GENERATOR
from slime_ext.trajectory.record import STATUS_ABORTED, STATUS_COMPLETED, STATUS_TRUNCATED

__all__ = [
    "ChatClient",
    "ChatCompletion",
    "ChatEpisode",
    "ChatError",
    "ChatRequestError",
    "ChatTimeoutError",
    "ChatTurn",
    "ChatUnavailableError",
    "chat_completions_url",
    "run_chat_episode",
]

log = logging.getLogger(__name__)

_RETRY_STATUS = (429, 502, 503, 504)
_BODY_SNIPPET_CHARS = 1000
# Keys the client sets itself; extra body params may not override them.
_OWNED_KEYS = ("model", "messages", "temperature", "max_tokens", "stream", "n")

# Sleep between attempts; module-level so tests can replace it.
_sleep = asyncio.sleep


class ChatError(RuntimeError):
    """Unexpected answer from the chat endpoint (HTTP 5xx, malformed JSON)."""


class ChatRequestError(ChatError):
    """The endpoint refused the request (HTTP 4xx other than 429): bad model name, prompt too long."""


class ChatUnavailableError(ChatError):
    """No answer after every retry (connection failures, 429, 502-504)."""


class ChatTimeoutError(ChatError):
    """No answer within timeout_s (not retried)."""


def chat_completions_url(url: str) -> str:
    """`http://host:port` or `.../v1` or the full `.../v1/chat/completions` -> the full URL."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


@dataclass
class ChatCompletion:
    content: str
    finish_reason: str
    reasoning: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float = 0.0


class ChatClient:
    def __init__(
        self,
        url: str,
        *,
        model: str,
        temperature: float,
        max_tokens: int = 8192,
        top_p: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
        api_key: str | None = None,
        timeout_s: float = 1800.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Args:
        url: the endpoint (see `chat_completions_url`); model: the `model` field sent.
        temperature, max_tokens, top_p: sampling; extra_body: other fields sent as they are.
        api_key: sent as `Authorization: Bearer ...` when given (read it from the environment,
            never from a file in the repository).
        """
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if max_tokens < 1 or max_retries < 0:
            raise ValueError("max_tokens must be >= 1 and max_retries >= 0")
        extra = dict(extra_body or {})
        owned = sorted(set(extra) & set(_OWNED_KEYS))
        if owned:
            raise ValueError(f"extra_body may not set {owned}: the client sets them")
        self.url = chat_completions_url(url)
        self.model = model
        self.temperature = float(temperature)
        self.max_tokens = int(max_tokens)
        self.top_p = top_p
        self.extra_body = extra
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            headers=headers,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def build_payload(
        self, messages: Sequence[Mapping[str, str]], *, max_tokens: int | None = None, seed: int | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = dict(self.extra_body)
        body.update(
            {
                "model": self.model,
                "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
                "temperature": self.temperature,
                "max_tokens": int(max_tokens or self.max_tokens),
                "n": 1,
                "stream": False,
            }
        )
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if seed is not None:
            body["seed"] = seed
        return body

    async def complete(
        self, messages: Sequence[Mapping[str, str]], *, max_tokens: int | None = None, seed: int | None = None
    ) -> ChatCompletion:
        """One chat completion; raises ChatRequestError / ChatUnavailableError / ChatTimeoutError /
        ChatError (see the module docstring for which failures are retried)."""
        body = self.build_payload(messages, max_tokens=max_tokens, seed=seed)
        last = ""
        for attempt in range(self._max_retries + 1):
            started = time.monotonic()
            retry_after: float | None = None
            try:
                response = await self._http.post(self.url, json=body)
            except httpx.ConnectTimeout as exc:
                last = f"connect timeout ({exc})"
            except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                # Refused, reset or dropped: a chat completion has no side effect, so send it again.
                last = f"{type(exc).__name__}: {exc}"
            except httpx.TimeoutException as exc:
                raise ChatTimeoutError(
                    f"{self.url}: no answer within the timeout ({type(exc).__name__})"
                ) from exc
            except httpx.HTTPError as exc:
                raise ChatError(f"{self.url}: {type(exc).__name__}: {exc}") from exc
            else:
                if response.status_code == 200:
                    return _parse_completion(self.url, response, time.monotonic() - started)
                text = response.text[:_BODY_SNIPPET_CHARS]
                if response.status_code in _RETRY_STATUS:
                    last = f"HTTP {response.status_code}: {text}"
                    try:
                        retry_after = float(response.headers.get("retry-after", ""))
                    except ValueError:
                        retry_after = None
                elif 400 <= response.status_code < 500:
                    raise ChatRequestError(f"{self.url}: HTTP {response.status_code}: {text}")
                else:
                    raise ChatError(f"{self.url}: unexpected HTTP {response.status_code}: {text}")
            if attempt < self._max_retries:
                delay = backoff_delay(attempt, self._backoff_s, self._max_backoff_s, retry_after)
                log.info("chat attempt %d failed (%s); retrying in %.2fs", attempt + 1, last, delay)
                await _sleep(delay)
        raise ChatUnavailableError(
            f"{self.url}: no answer after {self._max_retries + 1} attempt(s); last: {last}"
        )


def _parse_completion(url: str, response: httpx.Response, latency_s: float) -> ChatCompletion:
    try:
        data = response.json()
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content") or ""
        finish = choice.get("finish_reason") or "stop"
        reasoning = message.get("reasoning_content")
        if not isinstance(content, str) or not isinstance(finish, str):
            raise TypeError("content and finish_reason must be strings")
        usage = data.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ChatError(
            f"{url}: malformed chat completion ({type(exc).__name__}: {exc}): {response.text[:_BODY_SNIPPET_CHARS]}"
        ) from exc
    return ChatCompletion(
        content=content,
        finish_reason=finish,
        reasoning=reasoning if isinstance(reasoning, str) else None,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        latency_s=latency_s,
    )


# ---------------------------------------------------------------------------- the text-level loop


@dataclass
class ChatTurn:
    index: int
    finish_reason: str
    text: str = ""  # reasoning (in a <think> block, when the server separated it) + content
    candidate: str | None = None
    eval_result: dict[str, Any] | None = None
    eval_error: str | None = None
    reward: float = 0.0
    gen_s: float = 0.0
    eval_s: float = 0.0
    role: str = GENERATOR  # slime_ext/rollout/roles.py


@dataclass
class ChatEpisode:
    """The text-level counterpart of `slime_ext.rollout.episode.Episode` (no tokens: evaluation only)."""

    problem_id: str | None
    messages: list[dict[str, str]]
    turns: list[ChatTurn] = field(default_factory=list)
    status: str = STATUS_COMPLETED
    abort_reason: str | None = None
    early_stopped: bool = False
    timing: dict[str, float] = field(default_factory=dict)


def chat_template_kwargs(config: EpisodeConfig) -> dict[str, Any]:
    """The template variables the episode config asks for (`enable_thinking` and the others)."""
    kwargs = dict(config.chat_template_kwargs or {})
    if config.enable_thinking is not None:
        kwargs["enable_thinking"] = config.enable_thinking
    return kwargs


async def run_chat_episode(
    problem: Any,
    *,
    chat: ChatClient,
    evaluator: EvalClient,
    config: EpisodeConfig | None = None,
    seed: int | None = None,
) -> ChatEpisode:
    """A multi-turn episode against a chat endpoint (same turns, rewards and stops as
    `run_episode`). The conversation history sent back holds each answer's content only.

    A refused request (HTTP 4xx) on the first turn propagates (bad model name, prompt too long:
    the run is misconfigured); on a later turn the conversation outgrew the endpoint and the
    episode ends `truncated`. Other chat errors propagate: the caller stops the run.
    """
    config = config or EpisodeConfig()
    reference, problem_id = problem_fields(problem)
    started = time.monotonic()
    ep = ChatEpisode(
        problem_id=problem_id, messages=[dict(m) for m in build_messages(reference, config.prompt)]
    )
    gen_total = eval_total = 0.0
    role = GENERATOR
    for t in range(config.max_turns):
        try:
            comp = await chat.complete(
                ep.messages,
                max_tokens=config.max_new_tokens_per_turn,
                seed=None if seed is None else seed + t,
            )
        except ChatRequestError as exc:
            if t == 0:
                raise
            log.warning("problem %s: turn %d refused, episode truncated: %s", problem_id, t, exc)
            ep.status = STATUS_TRUNCATED
            break
        gen_total += comp.latency_s
        text = (
            comp.content
            if comp.reasoning is None
            else f"<think>\n{comp.reasoning}\n</think>\n\n{comp.content}"
        )
        turn = ChatTurn(index=t, finish_reason=comp.finish_reason, text=text, gen_s=comp.latency_s, role=role)
        ep.turns.append(turn)
        ep.messages.append({"role": "assistant", "content": comp.content})
        if comp.finish_reason == FINISH_ABORT:
            ep.status, ep.abort_reason = STATUS_ABORTED, "generation aborted by the server"
            break
        step = await evaluate_response(text, reference, problem_id, evaluator, config)
        step.record(turn)
        eval_total += step.eval_s
        if step.abort_reason is not None:
            ep.status, ep.abort_reason = STATUS_ABORTED, step.abort_reason
            break
        if step.stop:
            ep.early_stopped = True
            break
        if t + 1 >= config.max_turns:
            if comp.finish_reason == FINISH_LENGTH:
                ep.status = STATUS_TRUNCATED
            break
        ep.messages.append(step.next_message)
        role = step.next_role
    ep.timing = {"total_s": time.monotonic() - started, "generate_s": gen_total, "eval_s": eval_total}
    return ep
