"""The judge's end of the socket to the candidate's runner: requests with deadlines, and every
way the runner can fail turned into one exception the verdict code reads."""

from __future__ import annotations

import select
import socket
import time
from typing import Any

from eval_server import wire


class RunnerFailed(Exception):
    """The runner broke the protocol, died, or timed out; `message` is for the feedback."""


class RunnerError(Exception):
    """The runner reported an exception of the model it serves (traceback text from its side)."""


class Channel:
    def __init__(self, sock: socket.socket, deadline: float, max_payload: int = 1 << 30) -> None:
        self.sock = sock
        self.deadline = deadline  # time.monotonic() by which the whole evaluation must end
        self.max_payload = max_payload
        # set when the runner is asked to load the candidate: a failure before it is the
        # evaluator's (its own process died or refused), after it the candidate's
        self.candidate_asked = False

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def send(self, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
        if header.get("op") == "candidate":
            self.candidate_asked = True
        try:
            wire.send(self.sock, header, payload)
        except OSError as exc:
            raise RunnerFailed(f"the candidate's process is gone ({exc})") from None

    def recv(self) -> tuple[dict[str, Any], bytes]:
        try:
            msg, payload = wire.recv(self.sock, timeout_s=self.left(), max_payload=self.max_payload)
        except wire.WireError as exc:
            raise RunnerFailed(str(exc)) from None
        if "error" in msg:
            raise RunnerError(str(msg["error"])[:4000])
        return msg, payload

    def poll(self, timeout_s: float) -> tuple[dict[str, Any], bytes] | None:
        """A frame if one starts arriving within `timeout_s`, else None."""
        if not select.select([self.sock], [], [], min(timeout_s, self.left()))[0]:
            return None
        return self.recv()

    def ask(self, header: dict[str, Any], payload: bytes | memoryview = b"") -> tuple[dict[str, Any], bytes]:
        self.send(header, payload)
        return self.recv()

    def close(self) -> None:
        try:
            wire.send(self.sock, {"op": "exit"})
        except OSError:
            pass
        self.sock.close()
