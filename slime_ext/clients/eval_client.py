"""Async client of the kernel-evaluation HTTP service (`eval_server`).

Rollouts evaluate many candidates at once, against one eval server per GPU node. This client
spreads those calls over every server it knows (fewest requests in flight first), retries only
when nothing can have been evaluated (the connection failed, or the server answered 503 because
its queue was full), and turns every other failure into one exception type per cause, so that
the episode code can tell "the candidate is bad" (a normal EvalResult) from "the request is
wrong" (EvalRequestError), "the evaluators are down" (EvalUnavailableError) and "the evaluation
took too long" (EvalTimeoutError).

HTTP contract (see eval_server): `POST {url}/eval` with `EvalRequest.to_json()` (plus
`options.backend` for a kernel backend other than Triton) answers 200 with
`EvalResult.to_json()` once the evaluation is over; 400/413 `{"error": ...}` for a bad request;
503 with `Retry-After` when the queue is full (nothing evaluated); `GET {url}/health` answers
200 `{"status": "ok", ...}`.
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from eval_server.schema import EvalOptions, EvalRequest, EvalResult, ValidationError
from krl_common.backoff import backoff_delay
from krl_common.urls import parse_urls
from slime_ext.clients.backends import DEFAULT_BACKEND, check_backend

__all__ = [
    "EvalClient",
    "EvalClientError",
    "EvalRequestError",
    "EvalTimeoutError",
    "EvalUnavailableError",
    "with_backend",
]

log = logging.getLogger(__name__)

# How long a URL that just failed (connection error, or 503 without Retry-After) is avoided by
# new calls. Short on purpose: it only steers load elsewhere, it never blocks a URL outright
# (with every URL cooling down, calls still go to the least loaded one).
UNHEALTHY_COOLDOWN_S = 5.0

# Health probes must answer fast; a server that takes longer is reported as an error.
HEALTH_TIMEOUT_S = 10.0

# How much of an unexpected response body goes into an exception message.
_BODY_SNIPPET_CHARS = 1000


class EvalClientError(RuntimeError):
    """Base of every error raised by EvalClient (also used for unexpected server answers)."""

    def __init__(self, message: str, *, url: str | None = None, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.url = url
        self.status_code = status_code


class EvalRequestError(EvalClientError):
    """The server rejected the request (HTTP 4xx). Retrying the same request cannot help."""


class EvalUnavailableError(EvalClientError):
    """No server accepted the request: every attempt failed to connect or got 503 (queue full)."""


class EvalTimeoutError(EvalClientError):
    """No answer within timeout_s. Not retried: the server may still be evaluating the request,
    and sending it again would double the load exactly when the evaluators are slowest."""


# Sleep used between attempts; a module-level name so tests can observe the waits.
_sleep = asyncio.sleep


def with_backend(body: dict[str, Any], backend: str) -> dict[str, Any]:
    """The request body with `options.backend` set to a non-default backend (checked here, so a
    typo fails before any request is sent); the default leaves the body as it is."""
    check_backend(backend)
    if backend == DEFAULT_BACKEND:
        return body
    return {**body, "options": {**body.get("options", {}), "backend": backend}}


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date); None if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_message(response: httpx.Response, body: bytes) -> str:
    """The server's `{"error": ...}` message, or the start of the body if it has none."""
    text = body.decode("utf-8", errors="replace")
    try:
        data = response.json() if body else None
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return f"HTTP {response.status_code}: {text[:_BODY_SNIPPET_CHARS]}"


@dataclass
class _UrlState:
    url: str
    in_flight: int = 0
    cooldown_until: float = 0.0  # time.monotonic() before which new calls prefer other URLs


@dataclass
class _Retryable:
    """An attempt that failed before anything was evaluated; safe to send again."""

    reason: str
    retry_after: float | None = None


class EvalClient:
    """Evaluate candidates on one or more eval servers, spreading load and retrying safely.

    One instance is meant to be shared by every concurrent rollout of a process, so that the
    in-flight counts it balances on are the whole process's load. Use it from one event loop.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        max_in_flight_per_url: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        discovered: bool = False,
    ) -> None:
        """Args:
        urls: eval-server base URLs, as a list or a comma-separated string.
        timeout_s: longest wait for an answer to one attempt; evaluations (queueing included)
            can take minutes, so this is generous. Past it: EvalTimeoutError.
        connect_timeout_s: longest wait to connect; a server that does not accept a connection
            quickly is treated as down and another URL is tried.
        max_retries: extra attempts after the first one, for retryable failures only.
        backoff_s, max_backoff_s: exponential backoff (with jitter) between attempts and its cap
            (the cap also bounds a server's Retry-After).
        max_in_flight_per_url: if set, at most this many calls per URL at once; further calls
            wait for a free slot instead of piling up in the server's queue.
        transport: httpx transport to use instead of the network (tests).
        discovered: the URLs come from discovery (`set_urls`), so none yet is fine: calls wait.
        """
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("timeout_s and connect_timeout_s must be > 0")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if backoff_s < 0 or max_backoff_s < 0:
            raise ValueError("backoff_s and max_backoff_s must be >= 0")
        if max_in_flight_per_url is not None and max_in_flight_per_url < 1:
            raise ValueError("max_in_flight_per_url must be >= 1 (or None for no limit)")
        self._states = [_UrlState(url) for url in parse_urls(urls, allow_empty=discovered)]
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._limit = max_in_flight_per_url
        self._connect_timeout_s = connect_timeout_s
        self._rr = 0  # round-robin start for breaking ties between equally loaded URLs
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # No connection cap in httpx: concurrency is bounded by max_in_flight_per_url (if set)
        # and by the server's queue (503), never by a local pool that would time out silently.
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            transport=transport,
        )

    # ------------------------------------------------------------------ public API

    @property
    def urls(self) -> list[str]:
        """The normalised server URLs, in the order given."""
        return [s.url for s in self._states]

    def set_urls(self, urls: str | Sequence[str]) -> None:
        """Serve from these URLs from now on (discovered servers: slime_ext/cluster/eval_fleet.py).
        A URL kept keeps its in-flight count and cooldown; calls in flight to a dropped one finish
        or fail there (a lost server's are retried elsewhere); with no URL, calls wait for one."""
        known = {s.url: s for s in self._states}
        self._states = [known.get(url) or _UrlState(url) for url in parse_urls(urls, allow_empty=True)]
        self._rr = 0
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def in_flight(self) -> dict[str, int]:
        """Requests currently in flight per URL (for logs and metrics)."""
        return {s.url: s.in_flight for s in self._states}

    async def evaluate(self, request: EvalRequest, *, backend: str = DEFAULT_BACKEND) -> EvalResult:
        """Evaluate one request on the least loaded server and return the parsed result.

        `backend` (slime_ext/clients/backends.py), when not the default, is sent as `options.backend`;
        with the default the request's own `options.backend` is sent as it is.
        Raises EvalRequestError (4xx), EvalTimeoutError (no answer within timeout_s),
        EvalUnavailableError (every attempt failed to connect or got 503) or EvalClientError
        (any other unexpected answer). A failed candidate is not an error: it is a result.
        """
        body = with_backend(request.to_json(), backend)
        attempts = self._max_retries + 1
        avoid: str | None = None
        last = ""
        for attempt in range(attempts):
            state = await self._acquire(avoid)
            try:
                outcome = await self._post(state, body)
            finally:
                self._release(state)
            if isinstance(outcome, EvalResult):
                return outcome
            last = f"{state.url}: {outcome.reason}"
            avoid = state.url
            # Steer new calls away from this URL for a while (the server's Retry-After if it gave
            # one, bounded so a huge value cannot sideline a server for long).
            cooldown = UNHEALTHY_COOLDOWN_S
            if outcome.retry_after is not None:
                cooldown = min(outcome.retry_after, max(self._max_backoff_s, UNHEALTHY_COOLDOWN_S))
            state.cooldown_until = time.monotonic() + cooldown
            if attempt + 1 < attempts:
                delay = self._delay(attempt, outcome.retry_after)
                log.info(
                    "eval attempt %d/%d failed (%s); retrying in %.2fs", attempt + 1, attempts, last, delay
                )
                await _sleep(delay)
        raise EvalUnavailableError(
            f"no eval server accepted the request after {attempts} attempt(s) "
            f"(urls: {', '.join(self.urls)}); last error: {last}"
        )

    async def evaluate_source(
        self,
        reference: str,
        candidate: str,
        *,
        options: EvalOptions | None = None,
        problem_id: str | None = None,
        backend: str = DEFAULT_BACKEND,
    ) -> EvalResult:
        """Convenience wrapper: build the EvalRequest from the two sources and evaluate it."""
        request = EvalRequest(
            reference=reference,
            candidate=candidate,
            options=options if options is not None else EvalOptions(),
            problem_id=problem_id,
        )
        return await self.evaluate(request, backend=backend)

    async def health(self) -> dict[str, dict[str, Any]]:
        """Probe every server's /health at once: url -> its JSON, or {"error": ...}. Never raises
        (for startup checks and dashboards, where one dead node must not hide the others)."""
        results = await asyncio.gather(*(self._health_one(s.url) for s in self._states))
        return dict(zip(self.urls, results, strict=True))

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()

    async def __aenter__(self) -> EvalClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ load spreading

    def _pick(self, avoid: str | None) -> _UrlState | None:
        """The URL for the next call: healthy before cooling down, not the one that just failed,
        then fewest in flight; ties go round-robin. None if every URL is at its limit."""
        now = time.monotonic()
        n = len(self._states)
        best: int | None = None
        best_key: tuple[bool, bool, int] | None = None
        for offset in range(n):
            i = (self._rr + offset) % n
            state = self._states[i]
            if self._limit is not None and state.in_flight >= self._limit:
                continue
            key = (state.cooldown_until > now, state.url == avoid, state.in_flight)
            if best_key is None or key < best_key:
                best, best_key = i, key
        if best is None:
            return None
        self._rr = (best + 1) % n
        return self._states[best]

    async def _acquire(self, avoid: str | None) -> _UrlState:
        """Reserve a slot on a URL, waiting (FIFO) while every URL is at max_in_flight_per_url."""
        while True:
            state = self._pick(avoid)
            if state is not None:
                # No await between picking and counting: concurrent callers see this call.
                state.in_flight += 1
                return state
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # we were handed a free slot: pass it on
                raise

    def _release(self, state: _UrlState) -> None:
        state.in_flight -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        return backoff_delay(attempt, self._backoff_s, self._max_backoff_s, retry_after)

    # ------------------------------------------------------------------ one attempt

    async def _post(self, state: _UrlState, body: dict[str, Any]) -> EvalResult | _Retryable:
        """One POST /eval. Returns the result, or _Retryable when nothing can have been evaluated;
        raises for every failure that must not be retried."""
        url = state.url
        request = self._http.build_request("POST", f"{url}/eval", json=body)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.ConnectTimeout as exc:
            return _Retryable(f"connect timeout ({exc})")
        except httpx.TimeoutException as exc:
            # Read timeout: the server has the request and may still be evaluating it.
            # (Write/pool timeouts take as long, so the call's time budget is spent as well.)
            raise EvalTimeoutError(
                f"{url}: no answer within the timeout ({type(exc).__name__}); not retried, the "
                "server may still be evaluating",
                url=url,
            ) from exc
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            # Refused, reset or dropped before any response: nothing was evaluated to completion
            # (a stale keep-alive connection or a restarting server), so sending again is safe.
            return _Retryable(f"{type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:
            raise EvalClientError(f"{url}: {type(exc).__name__}: {exc}", url=url) from exc

        try:
            content = await response.aread()
        except httpx.TimeoutException as exc:
            raise EvalTimeoutError(f"{url}: timed out reading the response body", url=url) from exc
        except httpx.HTTPError as exc:
            # The server answered, so the evaluation ran; sending it again would repeat it.
            raise EvalClientError(
                f"{url}: connection lost while reading the response ({type(exc).__name__}: {exc})",
                url=url,
                status_code=response.status_code,
            ) from exc
        finally:
            await response.aclose()

        status = response.status_code
        if status == 503:
            return _Retryable(
                f"HTTP 503: {_error_message(response, content)}",
                retry_after=_parse_retry_after(response.headers.get("retry-after")),
            )
        state.cooldown_until = 0.0  # it answered: healthy again
        if status == 200:
            try:
                return EvalResult.from_json(response.json())
            except (ValueError, TypeError, AttributeError, ValidationError) as exc:
                raise EvalClientError(
                    f"{url}: malformed result ({type(exc).__name__}: {exc}): "
                    f"{content[:_BODY_SNIPPET_CHARS].decode('utf-8', errors='replace')}",
                    url=url,
                    status_code=status,
                ) from exc
        if 400 <= status < 500:
            raise EvalRequestError(_error_message(response, content), url=url, status_code=status)
        raise EvalClientError(
            f"{url}: unexpected HTTP {status}: "
            f"{content[:_BODY_SNIPPET_CHARS].decode('utf-8', errors='replace')}",
            url=url,
            status_code=status,
        )

    async def _health_one(self, url: str) -> dict[str, Any]:
        try:
            response = await self._http.get(
                f"{url}/health", timeout=httpx.Timeout(HEALTH_TIMEOUT_S, connect=self._connect_timeout_s)
            )
            if response.status_code != 200:
                return {"error": f"HTTP {response.status_code}: {response.text[:_BODY_SNIPPET_CHARS]}"}
            data = response.json()
            return data if isinstance(data, dict) else {"error": f"unexpected health body: {data!r}"}
        except Exception as exc:  # never raises: report it in the result instead
            return {"error": f"{type(exc).__name__}: {exc}"}
