"""The error replies of the buffer service: which exception becomes which HTTP status, each as
JSON `{"error": "..."}` (a rejected write stores nothing).

Separate from the handlers, which raise and never build error replies themselves.
"""

from __future__ import annotations

import logging
import sqlite3

from flask import Flask, Response, jsonify

from buffer_server.store.results import LeaseError, PolicyVersionError
from krl_common.validation import ValidationError

__all__ = ["register_error_handlers"]

log = logging.getLogger("buffer_server.app")  # the HTTP layer's logger, as before the split


def register_error_handlers(app: Flask) -> None:
    """400 for bad input, the LeaseError's own code, 503 (retry) for storage, 500 otherwise."""
    app.register_error_handler(ValidationError, _invalid)
    app.register_error_handler(PolicyVersionError, _bad_version)
    app.register_error_handler(LeaseError, _lease_error)
    app.register_error_handler(sqlite3.Error, _storage_error)
    app.register_error_handler(Exception, _internal)


def _invalid(exc: ValidationError) -> tuple[Response, int]:
    return jsonify(error=str(exc)), 400


def _bad_version(exc: PolicyVersionError) -> tuple[Response, int]:
    return jsonify(error=str(exc)), 400


def _lease_error(exc: LeaseError) -> tuple[Response, int]:
    return jsonify(error=str(exc)), exc.code


def _storage_error(exc: sqlite3.Error) -> tuple[Response, int]:
    log.exception("storage error")
    resp = jsonify(error=f"storage error, nothing of this request was stored or changed: {exc}")
    resp.headers["Retry-After"] = "5"
    return resp, 503


def _internal(exc: Exception) -> tuple[Response, int]:
    log.exception("unhandled error")
    return jsonify(error=f"internal error: {type(exc).__name__}: {exc}"), 500
