"""What the project's two HTTP services (eval server, buffer server) share: a Flask app whose
HTTP errors are JSON (`{"error": ...}`) and whose JSON replies are standard JSON only
(non-finite floats written as null, never NaN/Infinity), and the network flag group of their
CLIs."""

from __future__ import annotations

import argparse
import os
from typing import Any

from flask import Flask, Response, jsonify
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import HTTPException

from krl_common import fastjson

__all__ = ["StrictJSONProvider", "add_network_args", "json_flask_app"]


class StrictJSONProvider(DefaultJSONProvider):
    """Flask's JSON provider, but `jsonify` and friends write non-finite floats as null (through
    `fastjson.dumps_text`) instead of the NaN/Infinity that strict JSON parsers reject."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("default", self.default)
        kwargs.setdefault("ensure_ascii", self.ensure_ascii)
        kwargs.setdefault("sort_keys", self.sort_keys)
        return fastjson.dumps_text(obj, **kwargs)


def json_flask_app(name: str, max_body_bytes: int) -> Flask:
    """A Flask app with a body-size limit whose HTTP errors (404, 405, 413, ...) answer JSON and
    whose JSON replies never contain NaN/Infinity (`StrictJSONProvider`)."""
    app = Flask(name)
    app.json = StrictJSONProvider(app)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> tuple[Response, int]:
        code = exc.code or 500
        if code == 413:
            message = f"request body too large (limit {max_body_bytes} bytes)"
        else:
            message = f"{exc.name}: {exc.description}"
        return jsonify(error=message), code

    return app


def add_network_args(
    parser: argparse.ArgumentParser, *, env_prefix: str, port: int, max_body_mb: float
) -> argparse._ArgumentGroup:
    """The `network` group: --host / --port (env `<prefix>_HOST` / `<prefix>_PORT`, loopback by
    default) and --max-body-mb."""
    net = parser.add_argument_group("network")
    net.add_argument(
        "--host",
        default=os.environ.get(f"{env_prefix}_HOST", "127.0.0.1"),
        help=f"bind address (env {env_prefix}_HOST)",
    )
    net.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get(f"{env_prefix}_PORT", str(port))),
        help=f"listen port (env {env_prefix}_PORT)",
    )
    net.add_argument(
        "--max-body-mb",
        type=float,
        default=max_body_mb,
        help="largest accepted request body in MB; larger: 413",
    )
    return net
