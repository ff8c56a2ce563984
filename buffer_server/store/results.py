"""What the store's API hands back and raises: the results of put / lease / ack, the
per-instance totals and the store's errors.

Separate from the store so that a caller (the HTTP layer, the agent runner, a bench) reads the
shapes it receives without the SQL that produces them, and imports them without the class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from krl_common import fastjson

__all__ = [
    "AckResult",
    "InstanceCounts",
    "Lease",
    "LeaseError",
    "LeasedGroup",
    "PolicyVersionError",
    "PutResult",
    "StoreError",
]


class StoreError(RuntimeError):
    """The database cannot be used (locked by another server, wrong schema version)."""


class PolicyVersionError(ValueError):
    """A policy version that would move backwards."""


class LeaseError(ValueError):
    """An ack or release that cannot be honoured; `code` is the HTTP status that fits."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PutResult:
    accepted: int  # newly stored (and acknowledged) records, stale ones included
    duplicates: int  # uids already known: nothing stored
    stale: int  # of the accepted, dropped on arrival because their policy version is too old


@dataclass(frozen=True)
class LeasedGroup:
    instance_id: str
    records: list[bytes]  # each record's JSON, or its packed body (lease(packed=True)), in arrival order

    def decoded(self) -> list[dict[str, Any]]:
        """The records as JSON objects (of a JSON lease)."""
        return [fastjson.loads(r) for r in self.records]


@dataclass(frozen=True)
class Lease:
    lease_id: str | None  # None when no group was handed out
    groups: list[LeasedGroup]
    expires_at: float | None
    policy_version: int
    waited_s: float

    @property
    def num_records(self) -> int:
        return sum(len(g.records) for g in self.groups)


@dataclass(frozen=True)
class AckResult:
    lease_id: str
    groups: int
    records: int
    already: bool  # this lease had been acked before (a retried ack)


@dataclass(frozen=True)
class InstanceCounts:
    """Totals of one instance_id since the database was created (kept after pruning)."""

    accepted: int  # records accepted (duplicates not counted)
    consumed: int  # records handed out and acked
    dropped: int  # records dropped by a rule (stale, zero variance, group timeout)
    groups_consumed: int  # groups handed out and acked

    @property
    def held(self) -> int:
        """Records stored now (ready, partial or leased)."""
        return self.accepted - self.consumed - self.dropped
