"""What each timed call is given, and which timed calls are verified.

A candidate that can tell the calls being timed from the calls being checked can be right when
checked and skip work when timed. Two things take that signal away:

- **Fresh inputs on every call.** Each trial's calls get input tensors allocated for that trial
  (new tensor objects, new version counters), holding the values of input sets in an order
  drawn from a secret random generator, a set per call: within a batched trial too, consecutive
  calls need not share values, so "the same as the previous call" is not a safe guess, and
  neither the tensor's identity, address nor version counter says which values it holds.
- **Verified timed calls.** A secret share of trials are verification trials: one of their calls,
  chosen by the same generator, has its output copied right after it returns, and the copy is
  compared with the reference's output for that call's input set once timing is over. Until a
  call returns, nothing distinguishes it from any other timed call (same lead, same neighbours,
  same kind of inputs). The copy runs on the timed stream, so a verification trial's times are
  not used.

CUPTI records the kernels of the verification trials (Verification.record): the launch count,
foreign-kernel, stream and host-copy checks then cover timed calls too. Only those trials are
recorded: a timing under the profiler lost the escape checks' calibration (a ~4 us kernel was
rejected for escaped work in 7 of 8 evaluations on an H100, docs/BENCHMARKS.md), and a
verification trial's times are not used anyway.

The generator is seeded from the operating system per timing and lives only in the timing
function's locals: candidate code cannot read it (frames and the garbage collector are refused
by the audit hook, isolation/audit.py). Only copy kernels are used (the CUPTI checks count them
as data movement, not compute).
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eval_server.pipeline.loader import clone_args

# Share of trials that are verification trials, and the bounds on how many one timing keeps.
VERIFY_SHARE = 1 / 8
MIN_VERIFIED = 2
MAX_VERIFIED = 4
# Verification trials whose kernels are recorded (the first ones: their places are secret
# anyway); each recording starts and stops the profiler (~15 ms of a KernelBench evaluation).
MAX_RECORDED = 2
VERIFIED_BYTES = 2 << 30  # the kept output copies stay below this (at least MIN_VERIFIED)
# Each call's pooled tensor starts at a multiple of this many bytes from the trial's allocation,
# as a tensor of its own from torch's caching allocator does (512-byte blocks): a kernel that
# takes a vectorized path only on aligned pointers takes the same path when timed as when
# verified (found on an H100: a float4 ReLU with a scalar tail launched 1 kernel instead of 2
# on 3 of 4 timed calls of 7007 floats packed back to back, and was rejected for it).
CALL_ALIGN_BYTES = 512


def secret_rng() -> random.Random:
    """A generator seeded from the operating system (never from the request's seed)."""
    return random.Random(secrets.randbits(128))


def _poolable(input_sets: Sequence[Sequence[Any]], i: int) -> bool:
    """Whether argument `i` is a dense tensor of one shape and dtype in every set (pooled by
    one copy per trial); anything else is cloned per call."""
    first = input_sets[0][i]
    if not isinstance(first, torch.Tensor) or not first.is_contiguous():
        return False
    return all(
        isinstance(s[i], torch.Tensor)
        and s[i].shape == first.shape
        and s[i].dtype == first.dtype
        and s[i].is_contiguous()
        for s in input_sets
    )


class FreshInputs:
    """Argument lists for the calls of one trial: new tensors holding the values of the input
    sets in secret random order (module docstring).

    For `calls` k, the values come from stacked copies of the sets (3k slots, each a set
    drawn at random; for k = 1 the sets themselves), and a trial's inputs are a window of k
    consecutive slots at a random offset, copied into a tensor allocated for the trial (one copy
    kernel per argument per trial, whatever k is), each call's slot starting CALL_ALIGN_BYTES-aligned.
    """

    def __init__(self, input_sets: Sequence[Sequence[Any]], calls: int, rng: random.Random) -> None:
        if not input_sets:
            raise ValueError("FreshInputs needs at least one input set")
        self.sets = [list(s) for s in input_sets]
        self.calls = calls
        self.rng = rng
        n_args = len(self.sets[0])
        self.pooled = [_poolable(self.sets, i) for i in range(n_args)]
        if calls == 1:
            self.slot_sets = list(range(len(self.sets)))
            self.slots: list[torch.Tensor | None] = [None] * n_args
        else:
            self.slot_sets = [rng.randrange(len(self.sets)) for _ in range(3 * calls)]
            self.slots = [
                torch.stack([self.sets[s][i] for s in self.slot_sets]) if pooled else None
                for i, pooled in enumerate(self.pooled)
            ]

    def trial(self) -> tuple[list[list[Any]], list[int]]:
        """(one argument list per call, the input set of each call), freshly allocated."""
        k = self.calls
        if k == 1:
            offset = self.rng.randrange(len(self.sets))
        else:
            offset = self.rng.randrange(len(self.slot_sets) - k + 1)
        chosen = self.slot_sets[offset : offset + k]
        per_arg: list[list[Any]] = []
        for i, pooled in enumerate(self.pooled):
            if not pooled:
                per_arg.append([clone_args([self.sets[s][i]])[0] for s in chosen])
            elif k == 1:
                src = self.sets[chosen[0]][i]
                per_arg.append([torch.empty_like(src).copy_(src)])
            else:
                slots = self.slots[i]
                assert slots is not None
                per_arg.append(_aligned_copies(slots[offset : offset + k]))
        return [[arg[j] for arg in per_arg] for j in range(k)], chosen


def _aligned_copies(window: torch.Tensor) -> list[torch.Tensor]:
    """The k slots of `window` copied (one copy kernel) into one new allocation, each slot a
    contiguous tensor starting CALL_ALIGN_BYTES-aligned relative to the allocation."""
    k, shape = window.shape[0], window.shape[1:]
    numel, item = window[0].numel(), window.element_size()
    stride = numel
    if CALL_ALIGN_BYTES % item == 0:
        per = CALL_ALIGN_BYTES // item
        stride = -(-numel // per) * per
    rows = torch.empty((k, stride), dtype=window.dtype, device=window.device)[:, :numel]
    rows.copy_(window.reshape(k, numel))
    return [rows[j].view(shape) for j in range(k)]


def copy_output(out: Any) -> Any:
    """A copy of an output that later calls cannot change (tensors cloned, containers rebuilt)."""
    return clone_args([out])[0]


# Runs a trial and records its device activity: (the trial's result, kernel names, names of the
# activities off the timed stream); checks/runtime.profile_device_activity is one.
Recorder = Callable[[Callable[[], Any]], tuple[Any, list[str], list[str]]]


@dataclass
class Verification:
    """Which trials of one timing verify one of their calls, and what they leave for the caller:
    `kept` holds (input set index, output copy) pairs to compare; with a `record`er, every
    verification trial's kernels are recorded too (`names`, `off_stream`, over `recorded_calls`
    calls), so the kernel checks cover timed calls that cannot know they are checked."""

    rng: random.Random
    share: float = VERIFY_SHARE
    min_kept: int = MIN_VERIFIED
    max_kept: int = MAX_VERIFIED
    kept: list[tuple[int, Any]] = field(default_factory=list)
    record: Recorder | None = None
    names: list[str] = field(default_factory=list)
    off_stream: list[str] = field(default_factory=list)
    recorded_calls: int = 0

    def run(self, trial: Callable[[], Any], calls: int) -> Any:
        """Run a verification trial of `calls` calls, recording its kernels when asked to."""
        if self.record is None or self.recorded_calls >= MAX_RECORDED * calls:
            return trial()
        out, names, off_stream = self.record(trial)
        self.names += names
        self.off_stream += off_stream
        self.recorded_calls += calls
        return out

    @classmethod
    def for_output(cls, output_bytes: int, rng: random.Random | None = None) -> Verification:
        """Bounds for outputs of `output_bytes`: at most VERIFIED_BYTES of copies kept."""
        room = VERIFIED_BYTES // max(output_bytes, 1)
        return cls(rng=rng or secret_rng(), max_kept=max(MIN_VERIFIED, min(MAX_VERIFIED, room)))

    def pick(self, calls: int, force: bool = False) -> int | None:
        """The call of the next trial to verify (None: the trial is not a verification trial)."""
        if len(self.kept) >= self.max_kept:
            return None
        if force or self.rng.random() < self.share:
            return self.rng.randrange(calls)
        return None

    def short(self) -> bool:
        """Whether fewer than `min_kept` calls were verified (the timing adds trials until not)."""
        return len(self.kept) < self.min_kept
