"""Unit tests of slime_ext.clients.eval_client against an in-process stand-in for the eval server.

pytest-asyncio is not installed: each test drives its coroutine with asyncio.run().
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from eval_server.schema import EvalOptions, EvalRequest, EvalResult, TimingStats, TrialResult
from krl_common.urls import parse_urls
from krl_common.validation import ValidationError
from slime_ext.clients import eval_client
from slime_ext.clients.eval_client import (
    EvalClient,
    EvalClientError,
    EvalRequestError,
    EvalTimeoutError,
    EvalUnavailableError,
)

URL_A = "http://node-a:8000"
URL_B = "http://node-b:8000"

REFERENCE = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
CANDIDATE = (
    "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
)

RESULT = EvalResult(
    status="ok",
    compiled=True,
    correct=True,
    trials=[TrialResult(seed=42, passed=True, max_abs_diff=0.0, max_rel_diff=0.0)],
    candidate_timing=TimingStats(median_ms=1.0, min_ms=0.9, mean_ms=1.0, iqr_ms=0.1, cv=0.05, trials=100),
    speedup=1.5,
    feedback="correct",
    device="cpu (triton interpreter)",
    problem_id="p1",
    request_id="r1",
)

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class FakeEvalServer:
    """Test double of the eval server's documented HTTP protocol (POST /eval, GET /health),
    served through httpx.MockTransport. `respond(request, n)` decides each answer, where n
    counts the /eval calls already made to that host; every /eval call is recorded."""

    def __init__(self, respond: Callable[[httpx.Request, int], Awaitable[httpx.Response]]) -> None:
        self.respond = respond
        self.calls: list[tuple[str, dict]] = []  # (host, JSON body) per POST /eval

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/eval":
            host = request.url.host
            n = sum(1 for h, _ in self.calls if h == host)
            self.calls.append((host, json.loads(request.content)))
            return await self.respond(request, n)
        if request.method == "GET" and request.url.path == "/health":
            return await self.respond(request, 0)
        return httpx.Response(404, json={"error": "not found"})

    @property
    def hosts(self) -> list[str]:
        return [h for h, _ in self.calls]

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def ok_response() -> httpx.Response:
    return httpx.Response(200, json=RESULT.to_json())


def make_request(**kwargs: object) -> EvalRequest:
    return EvalRequest(reference=REFERENCE, candidate=CANDIDATE, **kwargs)  # type: ignore[arg-type]


def run_with_client(
    server: FakeEvalServer, urls: str | list[str], body: Callable[[EvalClient], Awaitable[object]], **kwargs
) -> object:
    async def main() -> object:
        async with EvalClient(urls, transport=server.transport(), **kwargs) as client:
            return await body(client)

    return asyncio.run(main())


@pytest.fixture
def recorded_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the client's waits between attempts instead of sleeping them."""
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)

    monkeypatch.setattr(eval_client, "_sleep", fake_sleep)
    return sleeps


# --------------------------------------------------------------------------- success


@pytest.mark.unit
def test_round_trip_sends_request_json_and_parses_result() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        assert request.headers["content-type"] == "application/json"
        return ok_response()

    server = FakeEvalServer(respond)
    request = make_request(
        options=EvalOptions(correctness_trials=3, timing=False), problem_id="p1", request_id="r1"
    )
    result = run_with_client(server, [URL_A], lambda c: c.evaluate(request))

    assert server.calls == [("node-a", request.to_json())]
    assert isinstance(result, EvalResult)
    assert result == RESULT
    assert isinstance(result.candidate_timing, TimingStats)


@pytest.mark.unit
def test_evaluate_source_builds_the_request() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        return ok_response()

    server = FakeEvalServer(respond)
    options = EvalOptions(seed=7)
    run_with_client(
        server, URL_A, lambda c: c.evaluate_source(REFERENCE, CANDIDATE, options=options, problem_id="p9")
    )
    expected = EvalRequest(reference=REFERENCE, candidate=CANDIDATE, options=options, problem_id="p9")
    assert server.calls == [("node-a", expected.to_json())]


@pytest.mark.unit
def test_backend_goes_into_the_options_only_when_not_the_default() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        return ok_response()

    server = FakeEvalServer(respond)
    options = EvalOptions(seed=7)

    async def both(c: EvalClient) -> None:
        await c.evaluate_source(REFERENCE, CANDIDATE, options=options, backend="cuda")
        await c.evaluate_source(REFERENCE, CANDIDATE, options=options, backend="triton")

    run_with_client(server, URL_A, both)
    cuda_body, triton_body = (body for _, body in server.calls)
    plain = EvalRequest(reference=REFERENCE, candidate=CANDIDATE, options=options).to_json()
    assert cuda_body == {**plain, "options": {**plain["options"], "backend": "cuda"}}
    assert triton_body == plain  # a server without the option still accepts Triton requests


@pytest.mark.unit
def test_unknown_backend_fails_before_sending() -> None:
    server = FakeEvalServer(lambda request, n: pytest.fail("nothing may be sent"))
    with pytest.raises(ValidationError, match="unknown kernel backend 'cuda-c'"):
        run_with_client(server, URL_A, lambda c: c.evaluate(make_request(), backend="cuda-c"))
    assert server.calls == []


# --------------------------------------------------------------------------- errors that are not retried


@pytest.mark.unit
@pytest.mark.parametrize("status", [400, 413])
def test_client_error_raises_request_error_after_one_attempt(status: int) -> None:
    message = "candidate: must not be empty"

    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(status, json={"error": message})

    server = FakeEvalServer(respond)
    with pytest.raises(EvalRequestError) as info:
        run_with_client(server, [URL_A, URL_B], lambda c: c.evaluate(make_request()), max_retries=5)
    assert info.value.message == message
    assert message in str(info.value)
    assert info.value.status_code == status
    assert len(server.calls) == 1


@pytest.mark.unit
def test_read_timeout_raises_timeout_error_after_one_attempt(recorded_sleeps: list[float]) -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    server = FakeEvalServer(respond)
    with pytest.raises(EvalTimeoutError):
        run_with_client(server, [URL_A, URL_B], lambda c: c.evaluate(make_request()), max_retries=5)
    assert len(server.calls) == 1
    assert recorded_sleeps == []


@pytest.mark.unit
def test_other_5xx_raises_client_error_after_one_attempt() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(500, text="internal boom")

    server = FakeEvalServer(respond)
    with pytest.raises(EvalClientError) as info:
        run_with_client(server, [URL_A, URL_B], lambda c: c.evaluate(make_request()), max_retries=5)
    assert type(info.value) is EvalClientError
    assert info.value.status_code == 500
    assert "500" in str(info.value) and "internal boom" in str(info.value)
    assert len(server.calls) == 1


class _BrokenBody(httpx.AsyncByteStream):
    """A response body whose connection drops after the status line and headers arrived."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"status": '
        raise httpx.ReadError("connection reset")


@pytest.mark.unit
def test_connection_lost_after_response_started_is_not_retried() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(200, stream=_BrokenBody())

    server = FakeEvalServer(respond)
    with pytest.raises(EvalClientError) as info:
        run_with_client(server, [URL_A, URL_B], lambda c: c.evaluate(make_request()), max_retries=5)
    assert not isinstance(info.value, (EvalUnavailableError, EvalTimeoutError))
    assert len(server.calls) == 1


@pytest.mark.unit
def test_malformed_result_raises_client_error() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(200, json={"status": "ok", "no_such_field": 1})

    server = FakeEvalServer(respond)
    with pytest.raises(EvalClientError, match="malformed result"):
        run_with_client(server, URL_A, lambda c: c.evaluate(make_request()))


# --------------------------------------------------------------------------- retries


@pytest.mark.unit
def test_connection_error_on_one_url_retries_on_the_other(recorded_sleeps: list[float]) -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        if request.url.host == "node-a":
            raise httpx.ConnectError("connection refused", request=request)
        return ok_response()

    server = FakeEvalServer(respond)

    async def two_calls(client: EvalClient) -> list[EvalResult]:
        return [await client.evaluate(make_request()), await client.evaluate(make_request())]

    results = run_with_client(server, [URL_A, URL_B], two_calls, backoff_s=0.001)
    assert results == [RESULT, RESULT]
    # First call: A fails, the retry goes to B. Second call: round-robin would pick A again,
    # but A is cooling down after its failure, so it goes straight to B.
    assert server.hosts == ["node-a", "node-b", "node-b"]
    assert len(recorded_sleeps) == 1


@pytest.mark.unit
def test_503_with_retry_after_then_success() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        if n == 0:
            return httpx.Response(503, json={"error": "queue full"}, headers={"Retry-After": "0"})
        return ok_response()

    server = FakeEvalServer(respond)
    result = run_with_client(server, URL_A, lambda c: c.evaluate(make_request()), backoff_s=0.001)
    assert result == RESULT
    assert server.hosts == ["node-a", "node-a"]  # a single server: the retry goes back to it


@pytest.mark.unit
def test_retry_after_is_honoured_and_capped(recorded_sleeps: list[float]) -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        retry_after = "0.5" if n == 0 else "30"
        return httpx.Response(503, json={"error": "queue full"}, headers={"Retry-After": retry_after})

    server = FakeEvalServer(respond)
    with pytest.raises(EvalUnavailableError, match="queue full"):
        run_with_client(
            server,
            URL_A,
            lambda c: c.evaluate(make_request()),
            max_retries=2,
            backoff_s=0.001,
            max_backoff_s=2.0,
        )
    assert recorded_sleeps == [0.5, 2.0]  # at least Retry-After, at most max_backoff_s
    assert len(server.calls) == 3


@pytest.mark.unit
def test_all_urls_down_raises_unavailable_after_max_retries(recorded_sleeps: list[float]) -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    server = FakeEvalServer(respond)
    with pytest.raises(EvalUnavailableError) as info:
        run_with_client(
            server, [URL_A, URL_B], lambda c: c.evaluate(make_request()), max_retries=3, backoff_s=0.001
        )
    assert len(server.calls) == 4
    assert server.hosts == ["node-a", "node-b", "node-a", "node-b"]  # each retry avoids the last failure
    message = str(info.value)
    assert URL_A in message and URL_B in message
    assert "connection refused" in message
    # Backoff grows exponentially (with jitter in [0.5, 1] of the nominal value).
    assert len(recorded_sleeps) == 3
    for attempt, delay in enumerate(recorded_sleeps):
        nominal = 0.001 * 2**attempt
        assert 0.5 * nominal <= delay <= nominal


# --------------------------------------------------------------------------- load spreading


@pytest.mark.unit
def test_concurrent_calls_are_split_evenly_over_urls() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        await asyncio.sleep(0.05)
        return ok_response()

    server = FakeEvalServer(respond)

    async def eight_at_once(client: EvalClient) -> list[EvalResult]:
        results = await asyncio.gather(*(client.evaluate(make_request()) for _ in range(8)))
        assert client.in_flight() == {URL_A: 0, URL_B: 0}
        return list(results)

    results = run_with_client(server, [URL_A, URL_B], eight_at_once)
    assert results == [RESULT] * 8
    assert Counter(server.hosts) == {"node-a": 4, "node-b": 4}


@pytest.mark.unit
def test_max_in_flight_per_url_makes_extra_calls_wait() -> None:
    current: Counter[str] = Counter()
    peak: Counter[str] = Counter()

    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        host = request.url.host
        current[host] += 1
        peak[host] = max(peak[host], current[host])
        await asyncio.sleep(0.02)
        current[host] -= 1
        return ok_response()

    server = FakeEvalServer(respond)

    async def six_at_once(client: EvalClient) -> list[EvalResult]:
        return list(await asyncio.gather(*(client.evaluate(make_request()) for _ in range(6))))

    results = run_with_client(server, [URL_A, URL_B], six_at_once, max_in_flight_per_url=1)
    assert results == [RESULT] * 6
    assert peak == {"node-a": 1, "node-b": 1}


@pytest.mark.unit
def test_cancelled_waiter_does_not_lose_the_free_slot() -> None:
    release_first = asyncio.Event()

    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        if n == 0:
            await release_first.wait()
        return ok_response()

    server = FakeEvalServer(respond)

    async def scenario(client: EvalClient) -> EvalResult:
        first = asyncio.create_task(client.evaluate(make_request()))
        await asyncio.sleep(0.01)
        cancelled = asyncio.create_task(client.evaluate(make_request()))
        waiting = asyncio.create_task(client.evaluate(make_request()))
        await asyncio.sleep(0.01)
        assert client.in_flight() == {URL_A: 1}  # the other two wait for the slot
        cancelled.cancel()
        release_first.set()
        await first
        result = await asyncio.wait_for(waiting, timeout=2.0)
        assert cancelled.cancelled()
        return result

    result = run_with_client(server, URL_A, scenario, max_in_flight_per_url=1)
    assert result == RESULT
    assert len(server.calls) == 2


@pytest.mark.unit
def test_slot_handed_to_a_cancelled_waiter_is_passed_on() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        return ok_response()

    server = FakeEvalServer(respond)

    async def scenario(client: EvalClient) -> EvalResult:
        held = await client._acquire(None)  # occupy the only slot directly
        cancelled = asyncio.create_task(client.evaluate(make_request()))
        waiting = asyncio.create_task(client.evaluate(make_request()))
        await asyncio.sleep(0.01)
        client._release(held)  # wakes `cancelled` first (FIFO) ...
        cancelled.cancel()  # ... which is cancelled before it can run
        result = await asyncio.wait_for(waiting, timeout=2.0)
        assert cancelled.cancelled()
        return result

    assert run_with_client(server, URL_A, scenario, max_in_flight_per_url=1) == RESULT
    assert len(server.calls) == 1


# --------------------------------------------------------------------------- URLs and health


@pytest.mark.unit
def test_urls_from_comma_separated_string() -> None:
    assert parse_urls(" http://node-a:8000/ , node-b:8000,, http://node-a:8000") == [URL_A, URL_B]
    assert parse_urls([URL_A + "//", URL_B]) == [URL_A, URL_B]

    async def build() -> list[str]:
        async with EvalClient(f"{URL_A}/,{URL_B}") as client:
            return client.urls

    assert asyncio.run(build()) == [URL_A, URL_B]


@pytest.mark.unit
@pytest.mark.parametrize("urls", ["", " , ", []])
def test_empty_url_list_is_rejected(urls: str | list[str]) -> None:
    with pytest.raises(ValueError):
        EvalClient(urls)


@pytest.mark.unit
def test_non_http_url_is_rejected() -> None:
    with pytest.raises(ValueError, match="scheme"):
        parse_urls("ftp://node-a:8000")


@pytest.mark.unit
def test_health_never_raises() -> None:
    async def respond(request: httpx.Request, n: int) -> httpx.Response:
        host = request.url.host
        if host == "node-a":
            return httpx.Response(200, json={"status": "ok", "workers": 8})
        if host == "node-b":
            raise httpx.ConnectError("connection refused", request=request)
        if host == "node-c":
            return httpx.Response(500, text="boom")
        return httpx.Response(200, text="not json")

    server = FakeEvalServer(respond)
    urls = [URL_A, URL_B, "http://node-c:8000", "http://node-d:8000"]
    health = run_with_client(server, urls, lambda c: c.health())
    assert health[URL_A] == {"status": "ok", "workers": 8}
    assert "connection refused" in health[URL_B]["error"]
    assert "500" in health["http://node-c:8000"]["error"]
    assert "error" in health["http://node-d:8000"]


def test_discovered_urls_calls_wait_for_a_server_then_use_the_new_list() -> None:
    """A discovering client may start with no server: its calls wait, and go where set_urls says
    once a server is known (a dropped URL gets no new call)."""
    server = FakeEvalServer(lambda request, n: _ok())

    async def scenario() -> list[str]:
        async with EvalClient([], discovered=True, transport=server.transport()) as client:
            call = asyncio.create_task(client.evaluate_source(REFERENCE, CANDIDATE))
            await asyncio.sleep(0.01)
            assert not call.done() and client.urls == []
            client.set_urls([URL_A])
            assert (await call).status == "ok"
            client.set_urls([URL_B])
            await client.evaluate_source(REFERENCE, CANDIDATE)
            return server.hosts

    assert asyncio.run(scenario()) == ["node-a", "node-b"]


def test_an_empty_url_list_is_refused_unless_discovered() -> None:
    with pytest.raises(ValueError):
        EvalClient([])


async def _ok() -> httpx.Response:
    return ok_response()
