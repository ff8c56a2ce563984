"""Async token-in/token-out client of SGLang's native `/generate` endpoint (via slime's router).

Request (`slime_interfaces.md` section 3): `POST {url}/generate` with
`{"input_ids": [...], "sampling_params": {...}, "return_logprob": true}`.
Response: `text`; `meta_info.output_token_logprobs`, a list of `[logprob, token_id, text?]` (ids
from index 1, logprobs from index 0; tokens are never re-derived from text);
`meta_info.finish_reason`, `{"type": "stop" | "length" | "abort", ...}`.

Rules kept here:
- Temperature is fixed per client (the rollout temperature): training divides the logits by
  `--rollout-temperature`, so sampling at any other temperature would make the stored log-probs
  and the importance ratio wrong. Passing another temperature raises ValueError.
- `max_new_tokens` is clamped to the context budget `max_context_len - len(input_ids)`; with no
  budget left no request is sent and the generation finishes with `length` and no tokens.
- Only connection failures (nothing reached the engine) are retried, with jittered exponential
  backoff. A read timeout is not retried (the engine may still be generating): SGLangTimeoutError.
- `abort` (e.g. slime aborting in-flight requests at the end of a rollout step) and `length` are
  normal outcomes, reported in `Generation.finish_reason`.
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

__all__ = [
    "DEFAULT_SAMPLING_PARAMS",
    "FINISH_ABORT",
    "FINISH_LENGTH",
    "FINISH_STOP",
    "Generation",
    "SGLangClient",
    "SGLangError",
    "SGLangTimeoutError",
    "SGLangUnavailableError",
]

log = logging.getLogger(__name__)

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_ABORT = "abort"
_FINISH_TYPES = (FINISH_STOP, FINISH_LENGTH, FINISH_ABORT)

# Defaults merged under the caller's sampling params (as slime sends them): keep the stop token in
# the output (the episode needs the sampled `<|im_end|>`), and keep special tokens in `text`.
DEFAULT_SAMPLING_PARAMS: dict[str, Any] = {
    "no_stop_trim": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
}

# Keys the client owns in sampling_params (callers may not override them through extra params).
_OWNED_KEYS = ("temperature", "max_new_tokens")


class SGLangError(RuntimeError):
    """Unexpected answer from the engine (HTTP error, malformed JSON)."""


class SGLangUnavailableError(SGLangError):
    """Could not connect to the engine after every retry."""


class SGLangTimeoutError(SGLangError):
    """No answer within timeout_s (not retried)."""


# Sleep between attempts; module-level so tests can replace it.
_sleep = asyncio.sleep


@dataclass
class Generation:
    """One generation call's outcome. `token_ids` and `logprobs` have the same length."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    finish_detail: dict[str, Any] = field(default_factory=dict)  # the engine's finish_reason object
    text: str = ""
    prompt_tokens: int | None = None
    latency_s: float = 0.0
    requested_max_new_tokens: int = 0  # after clamping to the context budget (0: no call made)


class SGLangClient:
    def __init__(
        self,
        url: str,
        *,
        temperature: float,
        max_context_len: int,
        default_max_new_tokens: int = 8192,
        sampling_params: Mapping[str, Any] | None = None,
        timeout_s: float = 1800.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Args:
        url: router (or engine) base URL, e.g. http://127.0.0.1:30000.
        temperature: the rollout temperature; every call samples at exactly this temperature.
        max_context_len: prompt + response token budget of a whole episode.
        default_max_new_tokens: per-call cap before clamping to the context budget.
        sampling_params: other fixed sampling params (top_p, top_k, stop_token_ids, ...), merged
            over DEFAULT_SAMPLING_PARAMS.
        timeout_s: longest wait for one answer; connect_timeout_s: to connect.
        max_retries, backoff_s, max_backoff_s: connection-failure retries.
        transport: httpx transport to use instead of the network (tests).
        """
        if temperature <= 0:
            raise ValueError("temperature must be > 0 (training divides logits by it)")
        if max_context_len < 1 or default_max_new_tokens < 1:
            raise ValueError("max_context_len and default_max_new_tokens must be >= 1")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        extra = {**DEFAULT_SAMPLING_PARAMS, **dict(sampling_params or {})}
        for key in _OWNED_KEYS:
            if key in extra:
                if key == "temperature" and abs(float(extra[key]) - temperature) > 1e-9:
                    raise ValueError(
                        f"sampling_params temperature {extra[key]} != rollout temperature {temperature}"
                    )
                extra.pop(key)
        self.url = url.rstrip("/")
        if "://" not in self.url:
            self.url = "http://" + self.url
        self.temperature = float(temperature)
        self.max_context_len = int(max_context_len)
        self.default_max_new_tokens = int(default_max_new_tokens)
        self.sampling_params = extra
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> SGLangClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def budget(self, n_input: int) -> int:
        """Tokens that may still be generated after n_input tokens of context."""
        return self.max_context_len - n_input

    def build_payload(
        self, input_ids: Sequence[int], max_new_tokens: int, extra: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        params = dict(self.sampling_params)
        params.update(extra or {})
        params["temperature"] = self.temperature
        params["max_new_tokens"] = max_new_tokens
        return {"input_ids": [int(t) for t in input_ids], "sampling_params": params, "return_logprob": True}

    async def generate(
        self,
        input_ids: Sequence[int],
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Generation:
        """Sample a continuation of input_ids. See the module docstring for the rules."""
        extra = dict(sampling_params or {})
        if "temperature" in extra:
            temperature = extra.pop("temperature") if temperature is None else temperature
        if temperature is not None and abs(float(temperature) - self.temperature) > 1e-9:
            raise ValueError(
                f"temperature {temperature} != rollout temperature {self.temperature}: the stored "
                "log-probs would not match what training computes"
            )
        extra.pop("max_new_tokens", None)
        if not input_ids:
            raise ValueError("input_ids must not be empty")
        wanted = self.default_max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        clamped = min(wanted, self.budget(len(input_ids)))
        if clamped <= 0:
            return Generation(
                [], [], FINISH_LENGTH, {"type": FINISH_LENGTH, "reason": "no context budget left"}
            )
        payload = self.build_payload(input_ids, clamped, extra)
        started = time.monotonic()
        data = await self._post_with_retries(payload, headers)
        gen = parse_generate_response(data)
        gen.latency_s = time.monotonic() - started
        gen.requested_max_new_tokens = clamped
        if len(gen.token_ids) > clamped:
            raise SGLangError(f"engine returned {len(gen.token_ids)} tokens for max_new_tokens={clamped}")
        return gen

    async def _post_with_retries(self, payload: dict[str, Any], headers: Mapping[str, str] | None) -> Any:
        url = f"{self.url}/generate"
        last = ""
        for attempt in range(self._max_retries + 1):
            try:
                response = await self._http.post(url, json=payload, headers=dict(headers or {}))
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                last = f"{type(exc).__name__}: {exc}"
                if attempt < self._max_retries:
                    delay = backoff_delay(attempt, self._backoff_s, self._max_backoff_s)
                    log.info("sglang connect failed (%s); retry %d in %.2fs", last, attempt + 1, delay)
                    await _sleep(delay)
                continue
            except httpx.TimeoutException as exc:
                raise SGLangTimeoutError(f"{url}: no answer in time ({type(exc).__name__})") from exc
            except httpx.HTTPError as exc:
                raise SGLangError(f"{url}: {type(exc).__name__}: {exc}") from exc
            if response.status_code != 200:
                raise SGLangError(f"{url}: HTTP {response.status_code}: {response.text[:1000]}")
            try:
                return response.json()
            except ValueError as exc:
                raise SGLangError(f"{url}: response is not JSON: {response.text[:1000]}") from exc
        raise SGLangUnavailableError(
            f"{url}: could not connect after {self._max_retries + 1} attempt(s): {last}"
        )


def parse_generate_response(data: Any) -> Generation:
    """Build a Generation from one /generate answer (a dict; a one-element list is accepted)."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise SGLangError(f"unexpected /generate answer: {str(data)[:500]}")
    meta = data["meta_info"]
    finish = meta.get("finish_reason")
    if isinstance(finish, str):
        finish = {"type": finish}
    if not isinstance(finish, dict) or finish.get("type") not in _FINISH_TYPES:
        raise SGLangError(f"unexpected finish_reason: {finish!r}")
    entries = meta.get("output_token_logprobs")
    if entries is None:
        entries = []
        if finish["type"] != FINISH_ABORT:
            raise SGLangError("meta_info.output_token_logprobs missing (was return_logprob sent?)")
    token_ids: list[int] = []
    logprobs: list[float] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, (list, tuple)) or len(entry) < 2:
            raise SGLangError(f"output_token_logprobs[{i}] malformed: {entry!r}")
        logprob, token_id = entry[0], entry[1]
        if logprob is None or isinstance(token_id, bool) or not isinstance(token_id, int):
            raise SGLangError(f"output_token_logprobs[{i}] malformed: {entry!r}")
        token_ids.append(token_id)
        logprobs.append(float(logprob))
    completion = meta.get("completion_tokens")
    if isinstance(completion, int) and completion != len(token_ids) and finish["type"] != FINISH_ABORT:
        raise SGLangError(f"completion_tokens={completion} but {len(token_ids)} logprob entries")
    return Generation(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=finish["type"],
        finish_detail=dict(finish),
        text=data.get("text") or "",
        prompt_tokens=meta.get("prompt_tokens"),
    )
