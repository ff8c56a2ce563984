"""Our call of slime's REAL abort-until-idle (slime_api.abort_engines_until_idle, which the buffer-mode
rollout function makes after stopping the runner, before slime offloads colocated engines) against
a labelled TEST DOUBLE of the SGLang router's `GET /workers` and of SGLang's `POST /abort_request`
and `GET /v1/loads?include=core`, in the shapes slime's `server_control` reads. The double's
requests leave only when aborted, one abort at a time: the call returns once slime saw the worker
idle. slime's source from tests/real_slime.py (skipped without it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from tests.real_slime import real_slime
from tests.router_double import JsonHandler, serve_router

pytestmark = pytest.mark.integration


class _Engines:
    """TEST DOUBLE (not SGLang, not its router): one worker with `running` requests; each
    `abort_all` removes at most two of them (a request mid-step outlives one abort)."""

    def __init__(self, running: int) -> None:
        self.running = running
        self.aborts: list[dict] = []
        self.lock = threading.Lock()


@contextmanager
def _router(engines: _Engines) -> Iterator[SimpleNamespace]:
    """The double served on loopback; yields slime's router arguments pointing at it."""

    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/workers":
                self.reply(200, {"workers": [{"url": self.base_url()}]})
            elif self.path == "/v1/loads?include=core":
                with engines.lock:
                    self.reply(200, {"loads": [{"num_reqs": engines.running}]})
            else:
                self.send_error(404)

        def do_POST(self) -> None:  # noqa: N802
            body = self.body()
            if self.path != "/abort_request":
                self.send_error(404)
                return
            with engines.lock:
                engines.aborts.append(body)
                if body.get("abort_all"):
                    engines.running = max(0, engines.running - 2)
            self.reply(200, {})

    with serve_router(Handler) as args:
        yield args


@pytest.fixture(scope="module")
def slime() -> Iterator[None]:
    with real_slime():
        from slime.utils import http_utils

        http_utils.init_http_client(
            SimpleNamespace(rollout_num_gpus=1, rollout_num_gpus_per_engine=1, sglang_server_concurrency=4,
                            use_distributed_post=False)
        )  # fmt: skip
        yield


@pytest.mark.parametrize("running", [0, 3])
def test_engines_are_aborted_until_idle(slime: None, running: int) -> None:
    from slime_ext.slime_plugins.slime_api import abort_engines_until_idle

    engines = _Engines(running)
    with _router(engines) as args:
        abort_engines_until_idle(args)
    assert engines.running == 0
    # idle at once: one abort; 3 requests: aborted, 1 left (slime waits and retries), aborted again
    assert engines.aborts == [{"abort_all": True}] * (1 if running == 0 else 2)


def test_engines_that_stay_busy_fail_the_step_with_the_reason(slime: None) -> None:
    """slime's own loop would retry without end; ours gives up after its timeout and says why."""
    from slime_ext.slime_plugins.slime_api import abort_engines_until_idle

    engines = _Engines(10**6)  # never idle within the bound
    with (
        _router(engines) as args,
        pytest.raises(RuntimeError, match=r"still had requests 0\.5 s after /abort_request"),
    ):
        abort_engines_until_idle(args, timeout_s=0.5)
    assert engines.aborts  # it did abort, at least once
