"""Cost of the output comparisons of one evaluation, this checkout against an earlier commit.

An evaluation compares the candidate's output with the reference's 5 times in correctness and
4-5 times after timing (eval_server/pipeline/evaluate.py), and the precision check runs normalized_error
on top; on a 1.6 G-element KernelBench output each pass is chunked. This times
`compare_outputs` and `normalized_error` from the working tree and from `--rev` (loaded from git,
same process, same tensors, alternating) on one device and prints medians and their ratio.

  python bench/compare_cost.py --rev 8b92331 --elements 67108864 --device cpu
  python bench/compare_cost.py --rev 8b92331 --elements 1610612736 --device cuda   # KernelBench ReLU size
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eval_server.checks import compare as current  # noqa: E402


def module_at(rev: str) -> ModuleType:
    """eval_server/checks/compare.py as it was at `rev`, imported under another name."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:eval_server/checks/compare.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="compare-cost-")) / "compare_at_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("compare_at_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _timed(fn: object, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", required=True, help="git revision to compare with")
    p.add_argument("--elements", type=int, default=1 << 26)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    device = torch.device(args.device)
    old = module_at(args.rev)
    g = torch.Generator(device=device).manual_seed(0)
    ref = torch.randn(args.elements, device=device, generator=g)
    cand = ref + 1e-6 * torch.randn(args.elements, device=device, generator=g)
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, mod in (("old", old), ("new", current)):
            for what, fn in (
                ("compare_outputs", lambda m=mod: m.compare_outputs(ref, cand, "default")),
                ("normalized_error", lambda m=mod: m.normalized_error(cand, ref)),
            ):
                times.setdefault(f"{what} {name}", []).append(_timed(fn, device))
    a, b = old.compare_outputs(ref, cand, "default"), current.compare_outputs(ref, cand, "default")
    assert (a.passed, a.max_abs_diff) == (b.passed, b.max_abs_diff), (a, b)
    print(f"{args.elements} fp32 elements on {device}, {args.repeats} repeats, old = {args.rev}")
    for what in ("compare_outputs", "normalized_error"):
        o, n = statistics.median(times[f"{what} old"]), statistics.median(times[f"{what} new"])
        print(f"{what:18s} old {o * 1e3:9.1f} ms  new {n * 1e3:9.1f} ms  old/new {o / n:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
