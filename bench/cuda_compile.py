"""Cost of the CUDA backend's compile phase (eval_server/pipeline/cuda_backend.py): cold and cached.

For each CUDA sample candidate, the compile process runs once on an empty build cache (cold) and
then `--repeats` times on the same cache (warm: a resubmitted kernel). On a GPU machine it builds
the extension as an evaluation does (`--mode build`); without one it runs the CPU compile check
(nvcc + host compiler, `--mode check`). Prints one JSON line per sample.

  python bench/cuda_compile.py                      # build on a GPU machine, check otherwise
  python bench/cuda_compile.py --mode check --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from eval_server import samples
from eval_server.pipeline import cuda_backend  # noqa: E402


def _timed(source: str, workdir: Path, cache: Path, build: bool) -> tuple[float, cuda_backend.BuildReport]:
    t0 = time.perf_counter()
    report = cuda_backend.compile_candidate(source, workdir, cache, timeout_s=600, build=build)
    return time.perf_counter() - t0, report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--mode", choices=["build", "check"], default="build" if torch.cuda.is_available() else "check"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    build = args.mode == "build"
    if build:
        cuda_backend.prepare_gpu_build(torch.device("cuda", 0))
    rows = []
    with tempfile.TemporaryDirectory(prefix="cuda-compile-bench-") as tmp:
        for case in samples.CUDA_SAMPLE_CASES:
            source = samples.load_candidate(case.candidate)
            workdir, cache = Path(tmp) / case.candidate, Path(tmp) / f"{case.candidate}-cache"
            workdir.mkdir()
            cold, report = _timed(source, workdir, cache, build)
            warm = [_timed(source, workdir, cache, build)[0] for _ in range(args.repeats)]
            row = {
                "candidate": case.candidate,
                "mode": args.mode,
                "cold_s": round(cold, 2),
                "warm_median_s": round(statistics.median(warm), 3) if warm else None,
                "compiled": report.compiled,
                "error": (report.error or "").splitlines()[:1],
                "unsupported": report.unsupported,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
