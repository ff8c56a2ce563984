"""TEST DOUBLE of an OpenAI-compatible chat endpoint (not a model; for tests only).

It serves `POST /v1/chat/completions` on loopback with the OpenAI request/response format:
request `{"model", "messages": [{"role", "content"}, ...], "temperature", "max_tokens", ...}`;
response `{"id", "object": "chat.completion", "created", "model", "choices": [{"index": 0,
"message": {"role": "assistant", "content"}, "finish_reason": "stop"}], "usage": {...}}`.
A request without `model` or with malformed `messages` gets 400 `{"error": {"message", ...}}`.

SCRIPTED: the answer is `responder(messages, body)`, a function the test supplies (a string, or
`(content, finish_reason)`). `fail_status` (with `fail_after`: answer that many requests first)
makes later requests fail with that HTTP status, as an endpoint outage. Every request body is
kept in `requests`. `wait_idle` waits until no request is being handled and none arrived for a
while: a client killed mid-request may still have one in the server's hands.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

from tests.router_double import JsonHandler

__all__ = ["OpenAIChatDouble"]

Responder = Callable[[list[dict[str, str]], dict[str, Any]], "str | tuple[str, str]"]


class OpenAIChatDouble:
    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.fail_status: int | None = None
        self.fail_after = 0
        self._served = 0
        self._in_flight = 0
        self._last_activity = time.monotonic()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        double = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:
                double._track(+1)
                try:
                    self._post()
                finally:
                    double._track(-1)

            def _post(self) -> None:
                if self.path != "/v1/chat/completions":
                    self.reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                except ValueError:
                    self.reply(
                        400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}}
                    )
                    return
                code, answer = double.handle(body)
                self.reply(code, answer)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _track(self, delta: int) -> None:
        with self._lock:
            self._in_flight += delta
            self._last_activity = time.monotonic()

    def wait_idle(self, quiet_s: float = 0.5, timeout_s: float = 30.0) -> None:
        """Block until no request is in hand and none started or ended for `quiet_s` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                idle = self._in_flight == 0 and time.monotonic() - self._last_activity >= quiet_s
            if idle:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the double still had {self._in_flight} request(s) in hand after {timeout_s} s"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def handle(self, body: Any) -> tuple[int, dict[str, Any]]:
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return 400, {"error": {"message": "model: required string", "type": "invalid_request_error"}}
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            return 400, {
                "error": {"message": "messages: list of {role, content}", "type": "invalid_request_error"}
            }
        with self._lock:
            self.requests.append(body)
            if self.fail_status is not None and self._served >= self.fail_after:
                return self.fail_status, {
                    "error": {"message": "endpoint down (test)", "type": "server_error"}
                }
            self._served += 1
        answer = self.responder(messages, body)
        content, finish = (answer, "stop") if isinstance(answer, str) else answer
        return 200, {
            "id": f"chatcmpl-test-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
            ],
            "usage": {
                "prompt_tokens": sum(len(m["content"].split()) for m in messages),
                "completion_tokens": len(content.split()),
                "total_tokens": 0,
            },
        }
