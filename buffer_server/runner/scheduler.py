"""Which group the agent runner starts next: epochs, a seeded shuffle per epoch, and the skip of
groups (and episodes) already written, so a restarted runner resumes instead of duplicating.

A *group* is `group_size` episodes of one prompt in one epoch; each episode has a sample index
`0 .. group_size-1`. Its records carry deterministic uids (`episode_uid`), so the store (which
is idempotent by uid and keeps every uid it ever accepted) tells which episodes exist: on start
the runner reads them once (`written_samples`) and the queues skip them.

Order: epoch e visits the prompts in `random.Random(f"{seed}:{salt}:{e}")` order (a string seed
is hashed with SHA-512 by Python, so the order is the same in every process and version).
Epoch e+1 starts only when every group of epoch e has been handed out, so two groups of one
instance never run at once. A prompt whose instance is *blocked* (its previous group still runs,
or waits in the store unconsumed) is passed over and taken as soon as it is free.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass

from slime_ext.rollout.problems import PromptRecord
from slime_ext.trajectory.record import MAX_ID_CHARS

__all__ = [
    "EpochQueue",
    "GroupTask",
    "episode_uid",
    "epoch_order",
    "instance_key",
    "record_uid",
    "validate_run_id",
    "written_samples",
]

RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# Room in a uid for "{run}:e{epoch}:s{sample}:t{turn}:" before the instance key.
_UID_OVERHEAD = 64 + 40
_UID_RE = re.compile(r"^e(\d+):s(\d+):(?:t(\d+):)?(.+)$")


def validate_run_id(run_id: str) -> str:
    if not RUN_ID_RE.match(run_id):
        raise ValueError(f"run_id: {run_id!r} must be 1-64 characters of A-Z a-z 0-9 _ . -")
    return run_id


def instance_key(instance_id: str) -> str:
    """The instance part of a uid: the id itself, or a hash when the uid would be too long."""
    if len(instance_id) <= MAX_ID_CHARS - _UID_OVERHEAD:
        return instance_id
    return "sha1-" + hashlib.sha1(instance_id.encode("utf-8")).hexdigest()


def episode_uid(run_id: str, epoch: int, instance_id: str, sample: int) -> str:
    """uid of a trajectory-credit record (one per episode)."""
    return f"{run_id}:e{epoch}:s{sample}:{instance_key(instance_id)}"


def record_uid(run_id: str, epoch: int, instance_id: str, sample: int, turn: int | None) -> str:
    """uid of one record: the episode's (trajectory credit, turn None) or one turn's (per_turn)."""
    if turn is None:
        return episode_uid(run_id, epoch, instance_id, sample)
    return f"{run_id}:e{epoch}:s{sample}:t{turn}:{instance_key(instance_id)}"


def written_samples(run_id: str, uids: Iterable[str]) -> dict[tuple[int, str], set[int]]:
    """(epoch, instance key) -> sample indexes with at least one record, from the store's uids.

    The records of one episode are written in one transaction, so one record means the episode
    is written. Uids that do not follow the scheme are ignored."""
    prefix = f"{run_id}:"
    done: dict[tuple[int, str], set[int]] = {}
    for uid in uids:
        if not uid.startswith(prefix):
            continue
        m = _UID_RE.match(uid[len(prefix) :])
        if m:
            done.setdefault((int(m.group(1)), m.group(4)), set()).add(int(m.group(2)))
    return done


def epoch_order(
    prompts: Sequence[PromptRecord], epoch: int, seed: int | None, salt: str = ""
) -> list[PromptRecord]:
    """The prompts in epoch `epoch`'s order: file order when `seed` is None, else a seeded shuffle."""
    order = list(prompts)
    if seed is not None:
        random.Random(f"{seed}:{salt}:{epoch}").shuffle(order)
    return order


@dataclass(frozen=True)
class GroupTask:
    """One group to run: its epoch, prompt, and the sample indexes that are not written yet."""

    epoch: int
    prompt: PromptRecord
    samples: tuple[int, ...]

    @property
    def instance_id(self) -> str:
        return self.prompt.instance_id


class EpochQueue:
    """`epochs` passes over a list of prompts, each in its own seeded order, skipping written
    episodes. Not thread-safe (the runner's event loop owns it)."""

    def __init__(
        self,
        prompts: Sequence[PromptRecord],
        *,
        group_size: int,
        epochs: int,
        seed: int | None,
        salt: str = "",
        done: Callable[[int, str], set[int]] | None = None,
    ) -> None:
        if group_size < 1:
            raise ValueError("group_size: must be >= 1")
        if epochs < 1:
            raise ValueError("epochs: must be >= 1")
        self.prompts = list(prompts)
        self.group_size = group_size
        self.epochs = epochs
        self.seed = seed
        self.salt = salt
        self._done = done or (lambda _epoch, _key: set())
        self.epoch = -1
        self._remaining: list[GroupTask] = []
        self.skipped_groups = 0  # groups found complete in the store (resume)
        self.resumed_groups = 0  # groups found partly written: only their missing episodes run
        self._next_epoch()

    def _next_epoch(self) -> None:
        """Advance to the next epoch that has anything left to run (or past the last one)."""
        while not self._remaining and self.epoch + 1 < self.epochs:
            self.epoch += 1
            for prompt in epoch_order(self.prompts, self.epoch, self.seed, self.salt):
                written = self._done(self.epoch, instance_key(prompt.instance_id))
                missing = tuple(k for k in range(self.group_size) if k not in written)
                if not missing:
                    self.skipped_groups += 1
                    continue
                if len(missing) < self.group_size:
                    self.resumed_groups += 1
                self._remaining.append(GroupTask(self.epoch, prompt, missing))
        if not self._remaining:
            self.epoch = self.epochs  # past the end

    @property
    def exhausted(self) -> bool:
        """Every group of every epoch has been handed out."""
        return not self._remaining

    @property
    def remaining_in_epoch(self) -> int:
        return len(self._remaining)

    def next(self, blocked: Container[str] = ()) -> GroupTask | None:
        """The next group whose instance is not blocked (None: exhausted, or all blocked)."""
        for i, task in enumerate(self._remaining):
            if task.instance_id not in blocked:
                del self._remaining[i]
                if not self._remaining:
                    self._next_epoch()
                return task
        return None
