"""What every HTTP handler of the buffer service reads: the store, the optional agent runner,
the request limits and the upload decoders, in one object that `create_app` builds once.

Separate so that the handlers are plain functions of (context) instead of closures inside
one large `create_app`, and each handler module reads alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from buffer_server.runner.agent_runner import AgentRunner
from buffer_server.store.buffer_store import BufferStore
from slime_ext.trajectory.codec import EncodedRecord

__all__ = ["ApiContext"]


@dataclass(frozen=True)
class ApiContext:
    """Built once by `create_app`; every handler gets it as its only argument."""

    store: BufferStore
    max_body_bytes: int  # larger request bodies: 413
    max_wait_s: float  # the longest `timeout_s` a batch request may wait
    # POST /trajectories: the fast path for JSON bodies (store/ingest.py; None from it: the full
    # path decides) and the validator of packed ones (slime_ext/trajectory/codec.py).
    encode_body: Callable[[bytes, int], list[EncodedRecord] | None]
    unpack_packed: Callable[[bytes, int], list[EncodedRecord]]
    runner: AgentRunner | None = None
    info: dict[str, Any] = field(default_factory=dict)  # added to /health and /stats
