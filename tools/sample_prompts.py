"""Write prompt records (slime_ext/rollout/problems.py) for the bundled sample problems.

  python -m tools.sample_prompts --out data/sample_prompts.jsonl
  python -m tools.sample_prompts --out data/two.jsonl --problems relu softmax

The single-GPU preset (PRESET=single_gpu_tiny) trains on these: they are the problems whose
correct and wrong candidates the embedded engine's scripted modes answer with. The CPU dry run
writes the same records. Exit 2 with one line for an unknown problem name.
"""

from __future__ import annotations

import sys

from krl_common.cli import EXIT_USAGE, make_parser
from slime_ext.dev_engine.scripted import sample_prompt_records
from slime_ext.rollout.problems import write_prompt_records


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.sample_prompts", __doc__)
    p.add_argument("--out", required=True, help="prompt-record jsonl to write (atomically)")
    p.add_argument("--problems", nargs="*", default=None, help="sample problem names (default: all)")
    args = p.parse_args(argv)
    try:
        records = sample_prompt_records(args.problems)
    except ValueError as exc:
        print(f"sample_prompts: {exc}", file=sys.stderr)
        return EXIT_USAGE
    n = write_prompt_records(args.out, records)
    print(f"{n} sample prompt record(s) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
