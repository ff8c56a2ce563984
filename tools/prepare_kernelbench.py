"""KernelBench -> the RL prompt jsonl (slime_ext/rollout/problems.py) + its train/holdout split manifest.

  python -m tools.prepare_kernelbench --input path/to/KernelBench --output data/kernelbench.jsonl
  python -m tools.prepare_kernelbench --input hf_kernelbench/data --levels 1,2 \\
      --holdout-ratio 0.2 --seed 1234 --output data/kb_l12.jsonl

`--input` is a KernelBench checkout (its `KernelBench/level<N>/` tree), a folder of the Hugging
Face dataset files, or one such file. The split is stratified by level and deterministic for a
given seed; it is written into every record (`split`) and into the manifest
(`<output stem>.split.json` unless --manifest is given), which the evaluation tool reads to
refuse reporting on train problems. `--split-from OLD.split.json` keeps every problem of an
earlier split where it was (new problems fill each level's holdout share). Both files are written
atomically. See docs/DATA.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from krl_common.cli import make_parser
from krl_common.validation import ValidationError
from slime_ext.data.kernelbench import load_kernelbench, to_prompt_record
from slime_ext.data.split import (
    assign_splits,
    build_manifest,
    default_manifest_path,
    load_split_manifest,
    pinned_splits,
    write_split_manifest,
)
from slime_ext.rollout.problems import write_prompt_records


def _levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"levels must be comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"levels must be integers >= 1, got {text!r}")
    return levels


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"holdout ratio must be within [0, 1], got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("tools.prepare_kernelbench", __doc__)
    p.add_argument("--input", required=True, help="KernelBench checkout, HF dataset folder or file")
    p.add_argument("--output", required=True, help="prompt jsonl to write")
    p.add_argument("--manifest", default=None, help="split manifest path (default: <output stem>.split.json)")
    p.add_argument("--levels", type=_levels, default=None, help="e.g. 1,2,3 (default: every level found)")
    p.add_argument(
        "--holdout-ratio",
        type=_ratio,
        default=None,
        help="share of each level held out (0.2, or --split-from's)",
    )
    p.add_argument("--seed", type=int, default=None, help="split seed (0, or --split-from's)")
    p.add_argument(
        "--split-from",
        default=None,
        metavar="MANIFEST",
        help="keep every problem of this earlier manifest in its split; only new problems are assigned",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        problems = load_kernelbench(args.input, args.levels)
        previous = load_split_manifest(args.split_from) if args.split_from else None
    except (ValidationError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else (previous.seed if previous else 0)
    ratio = (
        args.holdout_ratio
        if args.holdout_ratio is not None
        else (previous.holdout_ratio if previous else 0.2)
    )
    pinned = pinned_splits(previous) if previous else {}
    splits = assign_splits(((p.instance_id, p.level) for p in problems), ratio, seed, pinned)
    records = [to_prompt_record(p, splits[p.instance_id]) for p in problems]
    manifest = build_manifest(records, seed=seed, holdout_ratio=ratio, source=str(args.input))
    if previous:
        old_hashes = previous.problem_hashes
        manifest.extra.update(
            {
                "split_from": str(args.split_from),
                "pinned": sum(1 for r in records if r.instance_id in pinned),
                "edited_since_split_from": sorted(
                    r.instance_id
                    for r in records
                    if old_hashes.get(r.instance_id, r.problem_hash) != r.problem_hash
                ),
            }
        )
    manifest_path = Path(args.manifest) if args.manifest else default_manifest_path(args.output)
    # The manifest first: a prompt file never exists without the manifest that describes its split.
    write_split_manifest(manifest_path, manifest)
    try:
        write_prompt_records(args.output, records)
    except BaseException:
        manifest_path.unlink(missing_ok=True)  # it describes a prompt file that was not written
        raise
    print(f"{'level':>5} {'train':>6} {'holdout':>8}")
    for level, c in manifest.counts.items():
        print(f"{level:>5} {c['train']:>6} {c['holdout']:>8}")
    print(f"wrote {len(records)} prompt records to {args.output}; split manifest {manifest_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
