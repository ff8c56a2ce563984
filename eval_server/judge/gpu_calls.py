"""The judge's side of a GPU run: fresh inputs in, timed windows, snapshots of every output.

Per window w (k calls of the model the runner serves), on the judge's own stream:

    lead | e0 | fill the k input slots with fresh values | flush L2 | e_start | write go = c
       | wait done >= c | e_end | copy every output of the window (snapshot) | e_snap

The runner has queued [wait go >= c, its k calls, write done = c] on its stream before it told
the judge where the outputs will be; the judge maps those outputs, then queues the window in one
burst: the window e_start..e_end holds the hand-over to the runner's context, its queued GPU work
and the hand-back, and nothing of either host. Values exist only from the fill on (a secret seed
per window, drawn by the judge's `secrets`), so no work before the window can be useful, and the
snapshot is queued right behind "done", so the outputs the judge keeps are what existed when the
runner said it was done. The lead is a GPU sleep longer than the host takes to queue the burst
(twice the longest of the last bursts): without it an idle stream ran each step as the host queued
it, so the fill and snapshot times held the host's launch time, which host load stretches (honest
kernels rejected as escaped work while every core of the host was busy). Work the runner leaves
running after "done" shares the GPU with the
judge's own steps: it delays e_end (inside the window) or stretches the fill or the snapshot
(`pre_ms`, `post_ms`), which the escape check compares with the same steps of the reference's
run (timing.py). Which snapshots are compared with the reference is chosen by the judge and
never leaves its process.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from eval_server import gpu_ipc, wire
from eval_server.checks import persisting_l2
from eval_server.checks.compare import Comparison, flatten_output, unflatten_like
from eval_server.judge.channel import Channel, RunnerFailed
from eval_server.judge.precision import Rule, compare_call
from eval_server.pipeline import loader
from eval_server.pipeline.timing import gpu_cycles_per_ms

_POLL_S = 0.0005
# How long the judge waits for a window's reply before it writes go anyway: a forward that
# synchronizes with the GPU (.item(), a sync, a lazily loaded kernel) blocks its host until the
# stream it queued behind "go" runs, so the reply can only come after go.
STALL_S = 1.0
# The lead's bounds: twice the longest of the last LEAD_HISTORY bursts' host time, within these
LEAD_MIN_MS = 0.05
LEAD_MAX_MS = 2.0
LEAD_HISTORY = 8


def fresh_seed() -> int:
    """A seed drawn from the OS for each window or call: no seed says anything about another's (a
    runner that recovered one from its input values learns nothing about the next window)."""
    return secrets.randbits(62)


@dataclass(frozen=True)
class Leaf:
    """One tensor of the expected output (path, dtype, shape), from the judge's reference."""

    path: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def expected_leaves(out: Any) -> list[Leaf]:
    leaves = []
    for path, leaf in flatten_output(out):
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"the reference's output {path} is a {type(leaf).__name__}, not a tensor")
        leaves.append(Leaf(path, leaf.dtype, tuple(leaf.shape)))
    return leaves


class OutputMismatch(Exception):
    """The runner described outputs other than the reference's (structure, dtype, shape)."""


@dataclass
class Windows:
    """GPU milliseconds per window, measured on the judge's stream."""

    window_ms: list[float] = field(default_factory=list)  # e_start -> e_end: the k calls
    pre_ms: list[float] = field(default_factory=list)  # e0 -> e_start: fill + flush
    post_ms: list[float] = field(default_factory=list)  # e_end -> e_snap: the snapshot
    # windows whose reply came only after go (the runner's host blocked on the GPU before it
    # could say where its outputs are): not timed (their outputs are still compared when kept)
    stalled: int = 0

    def extend(self, other: Windows) -> None:
        self.window_ms += other.window_ms
        self.pre_ms += other.pre_ms
        self.post_ms += other.post_ms
        self.stalled += other.stalled


@dataclass
class Checked:
    """One verified call: its window's seed, its place in the window and the comparison of its
    snapshot with the reference."""

    seed: int
    call: int
    comparison: Comparison


class GpuSession:
    """Input slots and go/done words in judge-owned memory, shared with one runner."""

    def __init__(
        self,
        channel: Channel,
        device: torch.device,
        module: Any,
        reference: torch.nn.Module,
        leaves: Sequence[Leaf],
        tolerance: str,
        flush: torch.Tensor | None,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        """`stream`: the judge's one stream (a new one if None)."""
        self.channel = channel
        self.device = device
        self.module = module
        self.reference = reference
        self.leaves = list(leaves)
        self.tolerance = tolerance
        self.flush = flush
        self.stream = stream if stream is not None else torch.cuda.Stream(device)
        self.counter = 0
        self.sync = gpu_ipc.SharedBuffer.create(8, torch.int32, (2,), device)
        self.sync.tensor.zero_()
        self.slots: list[list[Any]] = []  # per slot: SharedBuffer or a plain value, per argument
        self._mapped: dict[str, tuple[int, int]] = {}  # runner handle -> (base here, size)
        self._views: dict[tuple[Any, ...], torch.Tensor] = {}  # checked output descriptions, until unmap
        self._scratch: dict[tuple[int, int], torch.Tensor] = {}
        self._bursts_ms: list[float] = []  # host time of the last bursts
        self._last_snapshot: torch.cuda.Event | None = None  # the previous window's, in this run
        # the precision rule compared calls are held to (judge/precision.py); None: tolerance only
        self.precision: Rule | None = None

    def _lead(self) -> None:
        """Queue the lead: a GPU sleep that outlasts this host's queueing of the next burst."""
        ms = min(max(2 * max(self._bursts_ms, default=0.0), LEAD_MIN_MS), LEAD_MAX_MS)
        torch.cuda._sleep(int(ms * gpu_cycles_per_ms(self.device)))

    # ---------------------------------------------------------------- set-up
    def bind(self, k: int) -> None:
        """k input slots shaped like the problem's inputs, mapped by the runner."""
        template = loader.make_inputs(self.module, fresh_seed(), self.device)
        while len(self.slots) < k:
            slot: list[Any] = []
            for arg in template:
                if isinstance(arg, torch.Tensor):
                    nbytes = arg.numel() * arg.element_size()
                    slot.append(gpu_ipc.SharedBuffer.create(nbytes, arg.dtype, tuple(arg.shape), self.device))
                else:
                    slot.append(arg)
            self.slots.append(slot)
        descs = [
            [
                {"handle": a.handle.hex(), **wire.tensor_meta(a.tensor)}
                if isinstance(a, gpu_ipc.SharedBuffer)
                else {"value": a}
                for a in slot
            ]
            for slot in self.slots
        ]
        torch.cuda.synchronize(self.device)
        self.channel.ask({"op": "bind", "sync": self.sync.handle.hex(), "slots": descs})

    def unmap(self) -> None:
        """Close the mappings of the runner's allocations (after a run: its snapshots are done). A
        mapping keeps memory alive that the runner has freed: kept open from the reference's
        timing on, it held what the runner's caching allocator gave back under pressure (fresh
        KernelBench softmax, 6.4 GB outputs: judge processes at 90-115 GB, the runner out of
        memory beside them, 1x H200). The next run maps again, before its windows' bursts."""
        self._last_snapshot = None
        self._close(list(self._mapped))

    def _close(self, handles: list[str]) -> None:
        """Close these mappings and forget the views into them."""
        for h in handles:
            base, _ = self._mapped.pop(h)
            try:
                gpu_ipc.close_handle(base)
            except gpu_ipc.DriverError:
                pass
        gone = set(handles)
        self._views = {key: v for key, v in self._views.items() if key[1] not in gone}

    def release(self) -> None:
        torch.cuda.synchronize(self.device)
        self.unmap()
        for slot in self.slots:
            for a in slot:
                if isinstance(a, gpu_ipc.SharedBuffer):
                    a.release()
        self.sync.release()

    # ---------------------------------------------------------------- one run
    def _view(self, desc: Any, leaf: Leaf) -> torch.Tensor:
        """The judge's view of one output the runner described, after checking it is the
        reference's dtype and shape and lies inside the allocation the handle names. Views are
        kept until unmap: the runner's allocator hands the same memory back window after window,
        and checking and building a view again took 42 us an output (1.5 ms a window of 32 calls,
        the judge's largest host cost per window, 1x H200)."""
        key = None
        if isinstance(desc, dict):
            try:  # a description equal to one checked before (unhashable parts: not cached)
                shape = desc.get("shape")
                key = (leaf.path, desc.get("handle"), desc.get("offset"), desc.get("dtype"), *shape)
                hit = self._views.get(key)
            except TypeError:
                key, hit = None, None
            if hit is not None:
                return hit
        view = self._checked_view(desc, leaf)
        if key is not None:
            self._views[key] = view
        return view

    def _checked_view(self, desc: Any, leaf: Leaf) -> torch.Tensor:
        if not isinstance(desc, dict) or "handle" not in desc:
            kind = desc.get("kind", "?") if isinstance(desc, dict) else "?"
            raise OutputMismatch(f"{leaf.path} is a {kind}, expected a CUDA tensor")
        dtype, shape, nbytes = wire.parse_meta(desc, 1 << 42)
        if dtype != leaf.dtype or shape != leaf.shape:
            raise OutputMismatch(
                f"{leaf.path} has dtype {str(dtype).removeprefix('torch.')} and shape {list(shape)}, "
                f"expected {str(leaf.dtype).removeprefix('torch.')} and {list(leaf.shape)}"
            )
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=self.device)
        handle, offset = desc.get("handle"), desc.get("offset")
        if not isinstance(handle, str) or not isinstance(offset, int) or offset < 0:
            raise RunnerFailed("an output description without a valid handle and offset")
        if handle not in self._mapped:
            try:
                base = gpu_ipc.open_handle(bytes.fromhex(handle))
            except (ValueError, gpu_ipc.DriverError) as exc:
                raise RunnerFailed(f"an output that cannot be mapped ({exc})") from None
            self._mapped[handle] = (base, gpu_ipc.address_range(base)[1])
        base, size = self._mapped[handle]
        if offset + nbytes > size:
            raise RunnerFailed("an output described beyond the end of its allocation")
        return gpu_ipc.tensor_at(base + offset, nbytes, dtype, shape, self.device)

    def _outputs(self, msg: dict[str, Any], k: int) -> list[list[torch.Tensor]]:
        calls = msg.get("outputs")
        if not isinstance(calls, list) or len(calls) != k:
            raise RunnerFailed("a window reply without one output list per call")
        views = []
        for descs in calls:
            if not isinstance(descs, list) or len(descs) != len(self.leaves):
                n = len(descs) if isinstance(descs, list) else "?"
                raise OutputMismatch(f"the output has {n} tensors, expected {len(self.leaves)}")
            views.append([self._view(d, leaf) for d, leaf in zip(descs, self.leaves, strict=True)])
        self._close_stale(calls)
        return views

    def _close_stale(self, calls: list[Any]) -> None:
        """Close the mappings of earlier windows' allocations that this window does not use, once
        they hold more than this window's own (and after the previous snapshot is done). A mapping
        keeps alive memory the runner has freed: a runner that gives back its output block and
        takes a new one every window (corpus case `moving_outputs`) would leave the judge holding
        one output per window until the run ended, GPU memory a candidate could fill until the
        judge fails. Outputs that stay where they were, or alternate between two blocks, never
        wait here. (Judges at 120 GB beside fresh KernelBench softmax were not this: their
        mappings stayed at 2 outputs; the snapshots were held by a reference cycle, see
        compare.unflatten_like.)"""
        handles = {
            d.get("handle")
            for descs in calls
            if isinstance(descs, list)
            for d in descs
            if isinstance(d, dict) and isinstance(d.get("handle"), str)
        }
        used = sum(size for h, (_, size) in self._mapped.items() if h in handles)
        stale = [h for h in self._mapped if h not in handles]
        if sum(self._mapped[h][1] for h in stale) <= used:
            return
        if self._last_snapshot is not None:
            self._wait(self._last_snapshot)
        self._close(stale)

    def _snapshot_into(self, j: int, keep: bool) -> list[torch.Tensor]:
        if keep:
            return [torch.empty(leaf.shape, dtype=leaf.dtype, device=self.device) for leaf in self.leaves]
        out = []
        for i, leaf in enumerate(self.leaves):
            key = (j, i)
            if key not in self._scratch:
                self._scratch[key] = torch.empty(leaf.shape, dtype=leaf.dtype, device=self.device)
            out.append(self._scratch[key])
        return out

    def run(
        self, windows: int, k: int, keep: set[tuple[int, int]] | None = None, flush: bool = True
    ) -> tuple[Windows, list[Checked]]:
        """`windows` windows of k calls (slots 0..k-1), each call on fresh inputs; the calls in
        `keep` ((window, call) pairs) are compared with the reference afterwards."""
        keep = keep or set()
        base = self.counter
        self.counter += windows
        self.channel.send({"op": "run", "windows": windows, "calls": list(range(k)), "counter": base})
        events: list[tuple[torch.cuda.Event, ...]] = []
        kept: list[tuple[int, int, list[torch.Tensor]]] = []
        stalled: set[int] = set()
        go, done = self.sync.ptr, self.sync.ptr + 4
        with torch.cuda.stream(self.stream), torch.no_grad():
            for w in range(windows):
                # The host's own work (input values, mapping the outputs the runner described,
                # snapshot buffers) comes first; then the window is queued in one burst, so no
                # step between its start and its snapshot waits for this host: a window's end
                # recorded after the host had mapped k outputs held ~0.3-0.6 ms of jittering host
                # time (A/A 0.82-1.03 at 32 calls per window, an H200 under MPS).
                # One secret seed per window, its k calls drawn in turn: the runner sees all k
                # slots at go, so values of one window tell it nothing it does not already have.
                seed = fresh_seed()
                fresh = loader.make_input_sets(self.module, seed, self.device, k)
                reply = self.channel.poll(STALL_S)
                views = self._window_outputs(reply[0], w, k) if reply is not None else None
                snaps = [self._snapshot_into(j, (w, j) in keep) for j in range(k)]
                persisting_l2.reset()
                e = tuple(torch.cuda.Event(enable_timing=True) for _ in range(4))
                self._lead()
                t0 = time.perf_counter()
                e[0].record(self.stream)
                # one call for every copy (a copy_ each took ~12 us of this host, 1x H200)
                dsts, srcs = [], []
                for j in range(k):
                    for dst, src in zip(self.slots[j], fresh[j], strict=True):
                        if isinstance(dst, gpu_ipc.SharedBuffer):
                            dsts.append(dst.tensor)
                            srcs.append(src)
                if dsts:
                    torch._foreach_copy_(dsts, srcs)
                del dsts, srcs  # the window's inputs go with `fresh`, before the next window's
                if flush and self.flush is not None:
                    self.flush.zero_()
                e[1].record(self.stream)
                gpu_ipc.write_value(self.stream, go, base + w + 1)
                gpu_ipc.wait_value(self.stream, done, base + w + 1)
                e[2].record(self.stream)
                if views is not None:
                    self._snapshot(views, snaps, e[3])
                    self._bursts_ms = [*self._bursts_ms[1 - LEAD_HISTORY :], (time.perf_counter() - t0) * 1e3]
                else:  # its host waits on the GPU (a sync in forward): go, then the reply
                    stalled.add(w)
                    msg, _ = self.channel.recv()
                    self._snapshot(self._window_outputs(msg, w, k), snaps, e[3])
                for j in range(k):
                    if (w, j) in keep:  # a stalled window's outputs too: right or wrong, they are
                        kept.append((seed, j, snaps[j]))  # what existed after its done
                events.append(e)
                self._last_snapshot = e[3]
                del fresh
            self._wait(events[-1][3])
        self.unmap()
        times = Windows(stalled=len(stalled))
        for w, e in enumerate(events):
            if w in stalled:  # its window holds host time: not a GPU time
                continue
            times.pre_ms.append(e[0].elapsed_time(e[1]))
            times.window_ms.append(e[1].elapsed_time(e[2]))
            times.post_ms.append(e[2].elapsed_time(e[3]))
        return times, [Checked(seed, j, self.check(seed, j, snap)) for seed, j, snap in kept]

    def _window_outputs(self, msg: dict[str, Any], w: int, k: int) -> list[list[torch.Tensor]]:
        if msg.get("window") != w:
            raise RunnerFailed(f"window {msg.get('window')!r} reported, expected {w}")
        return self._outputs(msg, k)

    def _snapshot(
        self, views: list[list[torch.Tensor]], snaps: list[list[torch.Tensor]], end: torch.cuda.Event
    ) -> None:
        """Queue the copy of every output of the window, then `end`."""
        dsts = [d for dst in snaps for d in dst]  # both k lists of the leaves (_outputs checked)
        if dsts:
            torch._foreach_copy_(dsts, [v for src in views for v in src])
        end.record(self.stream)

    def _wait(self, event: torch.cuda.Event) -> None:
        """Until the last window's snapshot is done, or the evaluation's deadline (the runner
        never signalled "done")."""
        while not event.query():
            if self.channel.left() <= 0:
                raise RunnerFailed("the candidate's calls did not finish before the time limit")
            time.sleep(_POLL_S)

    def check(self, seed: int, call: int, snapshot: list[torch.Tensor]) -> Comparison:
        """The reference's output on the inputs of call `call` of the window seeded `seed`
        (regenerated here), compared with a snapshot of the runner's."""
        args = loader.make_input_sets(self.module, seed, self.device, call + 1)[call]
        with torch.no_grad():
            expected = self.reference(*args)
        return compare_call(expected, unflatten_like(expected, snapshot), self.tolerance, self.precision)
