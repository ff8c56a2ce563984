"""Feasibility of the judge protocol on one GPU: its fixed cost and A/A noise, kernels ~2 us to ~5 ms.

For each problem a fresh (judge, runner) pair is forked from this process (which never touches
CUDA). The runner serves the problem's reference model (eval_server/runner/serve.py); the judge
times it through the protocol (eval_server/judge/timing.py: windows between its own events, go/done
by stream memory operations) and, in its own process, times the same model by plain CUDA events
around the same k calls after the same L2 flush (the in-process baseline). Reported per problem:

  in_process_ms   per call, median of 100 in-process windows
  judge_ms        per call, median over REPEATS protocol timings (each adaptive, as the evaluator's)
  fixed_us        (judge - in-process) per window: the hand-over to the runner's context and back
  aa_cv           CV of the REPEATS protocol medians (same pair), and aa_ratio: the median of a
                  second, freshly forked pair over the first (A/A across processes)
  pre_us/post_us  the judge's fill+flush and snapshot steps per window (GPU time)
  bind_ms         binding k input slots (allocated here, mapped by the runner, one warm call each)
  host_ms_per_window  wall time of the protocol timings (warm-up included) over their windows:
                  what a window costs the hosts of judge and runner, which work side by side

With --profile DIR, the judge's timings and each runner's whole life are profiled (cProfile files
DIR/<case>.judge.prof and DIR/<case>.runner<pid>.prof): where the hosts' time per window goes.

    python bench/judge_protocol.py --out judge_protocol.jsonl       # on a GPU machine
    python bench/judge_protocol.py --cases relu_64k,relu_1M [--k 64] [--mps off] [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RELU = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn({n})]
def get_init_inputs():
    return []
"""
MATMUL = """
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, a, b):
        return a @ b
def get_inputs():
    return [torch.randn({n}, {n}), torch.randn({n}, {n})]
def get_init_inputs():
    return []
"""
CASES = [
    ("relu_1", RELU.format(n=1)),
    ("relu_64k", RELU.format(n=1 << 16)),
    ("relu_1M", RELU.format(n=1 << 20)),
    ("relu_16M", RELU.format(n=1 << 24)),
    ("relu_128M", RELU.format(n=1 << 27)),
    ("relu_1G", RELU.format(n=1 << 30)),
    ("matmul_4096", MATMUL.format(n=4096)),
]
REPEATS = 5


def _no_first_layer(request: dict, share: float | None, facts: dict | None) -> tuple[dict, None]:
    raise RuntimeError("the bench serves the reference only")


def _runner_main(sock, workdir: str, case: str) -> None:
    import faulthandler

    import torch

    if os.environ.get("JUDGE_BENCH_STACKS_S"):  # where each process waits, if it hangs
        faulthandler.dump_traceback_later(float(os.environ["JUDGE_BENCH_STACKS_S"]), exit=True)

    from eval_server.runner.serve import serve

    profile_dir = os.environ.get("JUDGE_BENCH_PROFILE")
    if not profile_dir:
        serve(sock, torch.device("cuda", 0), workdir, _no_first_layer)
        return
    import cProfile

    prof = cProfile.Profile()
    try:
        prof.runcall(serve, sock, torch.device("cuda", 0), workdir, _no_first_layer)
    finally:
        prof.dump_stats(os.path.join(profile_dir, f"{case}.runner{os.getpid()}.prof"))


def _in_process(model, module, k: int, flush, device, n: int = 100) -> float:
    import torch

    from eval_server.pipeline import loader

    args = [loader.make_inputs(module, 1000 + j, device) for j in range(k)]
    times = []
    with torch.no_grad():
        for i in range(n + 5):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # the host's launches hide behind it, as under the judge's go (~1 ms: 64 launches of a
            # torch op; a shorter lead left small kernels' baseline host-bound, 2.3-13 us for one ReLU)
            torch.cuda._sleep(2_000_000)
            s.record()
            for j in range(k):
                model(*args[j])
            e.record()
            e.synchronize()
            if i >= 5:
                times.append(s.elapsed_time(e) / k)
    return statistics.median(times)


def _judge_case(name: str, source: str, out_path: str, force_k: int, mps: str) -> None:
    import cProfile
    import time

    import torch

    from eval_server.checks.compare import flatten_output  # noqa: F401
    from eval_server.judge.channel import Channel
    from eval_server.judge.gpu_calls import GpuSession, expected_leaves
    from eval_server.judge.pair import fork_runner
    from eval_server.judge.timing import choose_k, time_model
    from eval_server.pipeline import loader
    from eval_server.pipeline.timing import l2_flush_buffer

    workdir = tempfile.mkdtemp(prefix=f"judge-bench-{name}-")
    profile_dir = os.environ.get("JUDGE_BENCH_PROFILE")
    prof = cProfile.Profile() if profile_dir else None
    pairs = [fork_runner(lambda s: _runner_main(s, workdir, name)) for _ in range(2)]  # before CUDA
    if os.environ.get("JUDGE_BENCH_STACKS_S"):
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["JUDGE_BENCH_STACKS_S"]), exit=True)
    device = torch.device("cuda", 0)
    module = loader.import_source(source, workdir, "problem")
    model = loader.build_model(module.Model, [], 0, device)
    with torch.no_grad():
        leaves = expected_leaves(model(*loader.make_inputs(module, 0, device)))
    flush = l2_flush_buffer(device)
    request = {"reference": source, "options": {"seed": 0}}
    row: dict = {"case": name, "device": torch.cuda.get_device_name(device), "mps": mps}
    medians = []
    for p, (pid, sock) in enumerate(pairs):
        ch = Channel(sock, deadline=float("inf"))
        ch.send({"request": request})
        ch.ask({"op": "reference"})
        session = GpuSession(ch, device, module, model, leaves, "default", flush)
        session.bind(1)
        k = 1
        if p == 0:
            probe = time_model(session, 1, max_windows=100, min_windows=20, ci_rel=0.001, keep_cap=2)
            k = force_k or choose_k(probe.stats.median_ms)
            row["k"] = k
        else:
            k = row["k"]
        t_bind = time.perf_counter()
        session.bind(k)  # the runner maps k slots and calls the model once on each
        if p == 0:
            row["bind_ms"] = (time.perf_counter() - t_bind) * 1e3
        t0, counter0 = time.perf_counter(), session.counter
        if prof is not None and p == 0:
            prof.enable()
        reps = [
            time_model(session, k, max_windows=100, min_windows=20, ci_rel=0.001, keep_cap=2)
            for _ in range(REPEATS if p == 0 else 2)
        ]
        if prof is not None and p == 0:
            prof.disable()
        wall_ms = (time.perf_counter() - t0) * 1e3
        meds = [r.stats.median_ms for r in reps]
        medians.append(statistics.median(meds))
        if p == 0:
            row["judge_ms"] = statistics.median(meds)
            row["aa_cv"] = statistics.pstdev(meds) / statistics.fmean(meds)
            row["window_cv"] = statistics.median(r.stats.cv for r in reps)
            row["windows"] = [r.stats.trials for r in reps]
            # every window the hosts queued: the warm-up's (5 a batch) and the timed ones
            row["host_ms_per_window"] = wall_ms / (session.counter - counter0)
            row["verified"] = [r.stats.verified_calls for r in reps]
            row["wrong"] = sum(1 for r in reps if r.wrong())
            row["pre_us"] = statistics.median(r.pre_ms for r in reps) * 1e3
            row["post_us"] = statistics.median(r.post_ms for r in reps) * 1e3
            row["around_cv"] = statistics.pstdev(r.around_ms for r in reps) / statistics.fmean(
                r.around_ms for r in reps
            )
        session.release()
        ch.close()
        os.waitpid(pid, 0)
    row["aa_ratio"] = medians[1] / medians[0]
    row["in_process_ms"] = _in_process(model, module, row["k"], flush, device)
    row["fixed_us"] = (row["judge_ms"] - row["in_process_ms"]) * row["k"] * 1e3
    if prof is not None:
        prof.dump_stats(os.path.join(profile_dir, f"{name}.judge.prof"))
    with open(out_path, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="judge_protocol.jsonl")
    parser.add_argument("--cases", default=",".join(c for c, _ in CASES))
    parser.add_argument("--k", type=int, default=0, help="calls per window (0: the evaluator's rule)")
    parser.add_argument(
        "--mps",
        choices=("on", "off"),
        default="on",
        help="on: a CUDA MPS daemon of this bench's own, as the eval server runs (off: two contexts time-slice)",
    )
    parser.add_argument("--profile", default="", help="a folder for cProfile files of judge and runners")
    args = parser.parse_args()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        os.environ["JUDGE_BENCH_PROFILE"] = os.path.abspath(args.profile)  # inherited by the forks
    wanted = set(args.cases.split(","))
    with tempfile.TemporaryDirectory(prefix="judge-bench-mps-") as tmp:
        daemon = None
        if args.mps == "on":
            from eval_server.isolation.mps import MpsDaemon

            daemon = MpsDaemon.start(Path(tmp))
            os.environ.update(daemon.client_env())  # inherited by every forked judge and runner
        try:
            for name, source in CASES:
                if name in wanted:
                    _forked_case(name, source, args.out, args.k, args.mps)
        finally:
            if daemon is not None:
                daemon.stop()


def _forked_case(name: str, source: str, out: str, force_k: int, mps: str) -> None:
    """One case in a child of its own (this process never touches CUDA)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _judge_case(name, source, out, force_k, mps)
        except BaseException as exc:  # noqa: BLE001
            print(f"{name}: {type(exc).__name__}: {exc}", flush=True)
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status:
        print(f"{name}: judge exited with status {status}", flush=True)


if __name__ == "__main__":
    main()
