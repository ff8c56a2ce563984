"""Jittered exponential backoff, the one retry delay rule of every HTTP client in the project."""

from __future__ import annotations

import random


def backoff_delay(attempt: int, base_s: float, max_s: float, retry_after: float | None = None) -> float:
    """Jittered exponential backoff (base_s * 2^attempt, times 0.5-1.0), at least the server's
    Retry-After, at most max_s. Shared by the eval and SGLang clients."""
    jittered = min(max_s, base_s * (2**attempt)) * random.uniform(0.5, 1.0)
    return min(max_s, max(jittered, retry_after or 0.0))
