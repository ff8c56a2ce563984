"""What the HTTP TEST DOUBLES share (not the router, not SGLang, not an OpenAI server): a JSON
handler base (also tests/openai_double.py's), and a loopback server that yields slime's router
arguments pointing at a double of slime's SGLang router and workers. Each test module defines the
endpoints it stands in for, in the shapes slime / SGLang use."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

__all__ = ["JsonHandler", "serve_router"]


class JsonHandler(BaseHTTPRequestHandler):
    """Replies with JSON bodies; quiet."""

    def reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_router(handler: type[BaseHTTPRequestHandler]) -> Iterator[SimpleNamespace]:
    """`handler` served on loopback; yields `sglang_router_ip` / `sglang_router_port` for it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host, port = server.server_address[:2]
        yield SimpleNamespace(sglang_router_ip=host, sglang_router_port=port)
    finally:
        server.shutdown()
        server.server_close()
