"""One judge evaluation on the GPU with a runner whose first layer is replaced by a compromised
one (it reports `ok` and serves the model named on the command line), in a fresh interpreter so
no CUDA context exists before the fork. Prints the judge's result as one JSON line.

    python -m tests.gpu.judge_harness honest 16777216
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from eval_server.judge.channel import Channel, RunnerFailed
from eval_server.judge.evaluate import evaluate, reference_cache_key
from eval_server.judge.pair import fork_runner
from eval_server.pipeline.context import EvalContext
from eval_server.pipeline.ref_cache import RefTimingCache
from eval_server.runner.serve import serve
from eval_server.schema import EvalResult, TimingStats, parse_request, problem_hash

PROBLEM = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
N = {n}
def get_inputs():
    return [torch.randn(N)]
def get_init_inputs():
    return []
"""


class Honest(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


class SideStream(torch.nn.Module):
    """The work on another stream, left running when forward returns (escaped work)."""

    def __init__(self) -> None:
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            torch.cuda._sleep(1_000_000)
            torch.clamp(x, min=0, out=out)
        return out


class HostSync(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(x)
        torch.cuda.synchronize()
        return out


class EveryOther(torch.nn.Module):
    """Right on odd calls, the previous output on even ones (half the work)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.last = 0, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.last is None or self.calls % 2:
            self.last = torch.relu(x)
        return self.last


class SampledMemo(torch.nn.Module):
    """A device-side cache keyed on 64 sampled input values (content-keyed memoization)."""

    def __init__(self) -> None:
        super().__init__()
        self.key, self.out = None, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = x.view(-1)[:: max(1, x.numel() // 64)][:64].clone()
        if self.key is not None and torch.equal(key, self.key):  # a host sync, but cheap
            return self.out
        self.key, self.out = key, torch.relu(x)
        return self.out


class _Lazy(torch.Tensor):
    """An output that does its work when its address is asked for the second time: the runner's
    first look (its copy rules) comes before "done" is queued, the second (the description it
    sends the judge) after, so the work lands outside the window."""

    pending: torch.Tensor | None = None
    asked = 0

    def data_ptr(self) -> int:  # type: ignore[override]
        self.asked += 1
        if self.asked == 2 and self.pending is not None:
            x, self.pending = self.pending, None
            torch.clamp(x, min=0, out=self.as_subclass(torch.Tensor))
        return super().data_ptr()


class LazyOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x).as_subclass(_Lazy)
        out.pending = x
        return out


class EarlyDone(torch.nn.Module):
    """Says "done" as its window starts: copies the go word into the done word (judge memory the
    runner maps, found here as an attacker would, through gc) on its stream before its work."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import gc

        from eval_server import gpu_ipc

        runner = next(
            o for o in gc.get_objects() if type(o).__name__ == "Runner" and getattr(o, "sync_ptr", 0)
        )
        words = gpu_ipc.tensor_at(runner.sync_ptr, 8, torch.int32, (2,), x.device)
        words[1:].copy_(words[:1])
        return torch.relu(x)


def _describe_judge_memory() -> None:
    """A runner that names judge memory as its outputs: the judge now maps a window's outputs
    before it queues the window, from the runner's description; this one records the handles of
    the judge's input slots it was sent at bind and describes every output as slot 0's memory
    (what native code in a runner could forge). The judge must not score its own memory. Installed
    before the reference runs in this process (the reference's windows bind first), it forges only
    the candidate's descriptions."""
    from eval_server.runner.serve import Runner

    bind, describe = Runner.bind, Runner._describe

    def recording_bind(self: Runner, msg: dict) -> None:
        self.judge_handles = [d["handle"] for slot in msg["slots"] for d in slot if "handle" in d]
        bind(self, msg)

    def forged(self: Runner, leaves: list) -> list:
        if type(self.model).__name__ == "Model":  # the reference's windows: left as they are
            return describe(self, leaves)
        return [
            {**d, "handle": self.judge_handles[0], "offset": 0} if "handle" in d else d
            for d in describe(self, leaves)
        ]

    Runner.bind, Runner._describe = recording_bind, forged  # type: ignore[method-assign]


MODELS = {
    "honest": Honest,
    "side_stream": SideStream,
    "host_sync": HostSync,
    "every_other": EveryOther,
    "sampled_memo": SampledMemo,
    "lazy_output": LazyOutput,
    "poisoned_cache": Honest,
    "freed_between": Honest,
    "early_done": EarlyDone,
    "judge_memory_output": Honest,
}


def main() -> None:
    case, n = sys.argv[1], int(sys.argv[2])
    workdir = Path(tempfile.mkdtemp(prefix="judge-gpu-"))
    report = EvalResult(status="ok", compiled=True, correct=True, speedup=100.0).to_json()

    def first_layer(req: dict, share: float | None, facts: dict | None) -> tuple[dict, torch.nn.Module]:
        if case == "freed_between":  # as the real first layer's memory poisoning does: the segments
            torch.cuda.empty_cache()  # of the reference's outputs go back to the driver
        return report, MODELS[case]().cuda()

    def runner_main(sock) -> None:
        if case == "judge_memory_output":
            _describe_judge_memory()
        serve(sock, torch.device("cuda", 0), str(workdir), first_layer)

    _, sock = fork_runner(runner_main)
    request = parse_request({"reference": PROBLEM.format(n=n), "candidate": "x = 1\n"})
    cache = None
    if case == "poisoned_cache":  # what native code in a runner could write into the judge's cache
        cache = RefTimingCache(workdir / "ref_timing.sqlite")
    ctx = EvalContext(
        device=torch.device("cuda", 0),
        device_label="cuda:0",
        workdir=workdir,
        timing_enabled=True,
        ref_cache=cache,
    )
    if cache is not None:
        key = reference_cache_key(problem_hash(request.reference), ctx, request.options)
        forged = TimingStats(median_ms=100.0, min_ms=100.0, mean_ms=100.0, iqr_ms=0.0, cv=0.0, trials=100,
                             method="gpu-time", calls_per_trial=1)  # fmt: skip
        cache.put(key, forged)
    try:
        result = evaluate(request, ctx, Channel(sock, deadline=float("inf")))
    except RunnerFailed as exc:  # what the worker reports as the candidate's `crashed` (worker._judge)
        print(json.dumps({"status": "crashed", "feedback": str(exc), "checks": []}))
        return
    print(json.dumps(result.to_json(), default=str))


if __name__ == "__main__":
    main()
