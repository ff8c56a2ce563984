"""Write the records of one split of a prompt-record file (slime_ext/rollout/problems.py).

  python -m tools.split_prompts data/kernelbench.jsonl runs/r1/prompts_train.jsonl --split train

slime's data source reads every record of its `--prompt-data`, whatever its `split`; the
launcher's in-slime mode (MODE=in_slime) gives it the train records of PROMPT_DATA this way.
The records are validated on read and written unchanged, in order, atomically. Exit 2 with one
line when the input is missing or invalid, 1 when it holds no record of that split.
"""

from __future__ import annotations

import sys

from krl_common.cli import EXIT_USAGE, make_parser
from krl_common.validation import ValidationError
from slime_ext.rollout.problems import SPLITS, load_prompt_records, write_prompt_records


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.split_prompts", __doc__)
    p.add_argument("input", help="prompt-record jsonl")
    p.add_argument("output", help="jsonl to write")
    p.add_argument("--split", choices=SPLITS, default="train", help="the records to keep")
    args = p.parse_args(argv)
    try:
        records = [r for r in load_prompt_records(args.input) if r.split == args.split]
    except (FileNotFoundError, ValidationError) as exc:
        print(f"split_prompts: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not records:
        print(f"split_prompts: {args.input} has no {args.split} record", file=sys.stderr)
        return 1
    n = write_prompt_records(args.output, records)
    print(f"{n} {args.split} record(s) of {args.input} -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
