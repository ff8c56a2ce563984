"""AI CUDA Engineer Archive -> slime SFT data for the `cuda` backend: `tools.prepare_kernelbook_sft
--backend cuda` (one pipeline: the same filters, dedup, verification and report; see docs/DATA.md).

  python -m tools.prepare_cuda_sft --input AI-CUDA-Engineer-Archive/ --output data/sft_cuda.jsonl \\
      --exclude-problems data/kb_holdout.jsonl --per-task 4 --verify-url http://127.0.0.1:18188

Every flag of tools.prepare_kernelbook_sft applies (`python -m tools.prepare_kernelbook_sft -h`).
"""

from __future__ import annotations

import sys

from tools import prepare_kernelbook_sft


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a == "--backend" or a.startswith("--backend=") for a in args):
        print("error: tools.prepare_cuda_sft is --backend cuda; leave --backend out", file=sys.stderr)
        return 2
    parser = prepare_kernelbook_sft.build_parser("tools.prepare_cuda_sft", __doc__)
    return prepare_kernelbook_sft.main(["--backend", "cuda", *args], parser)


if __name__ == "__main__":
    sys.exit(main())
