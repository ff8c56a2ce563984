"""The deterministic, stratified train/holdout split and its manifest.

Split rule (per stratum, e.g. per KernelBench level): order the problems by
sha256("<seed>:<instance_id>") and put the first round(ratio * n) (half up) in `holdout`, the rest
in `train`. The order depends only on the seed and each problem's own id, never on file order or
on which other problems exist, so the same seed gives the same split on every machine. Problems
recorded in an earlier manifest can be pinned to their earlier split (`pinned_splits`), so a
grown dataset never moves a trained-on problem into holdout.

The manifest (JSON, written beside the prompt file) records the split so that the evaluation tool
can refuse to report on problems that were trained on: `load_split_manifest`, `split_of`,
`is_holdout`, `check_reportable`. Its format is documented in docs/DATA.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krl_common.validation import ValidationError, check_type, reject_unknown
from slime_ext.data.files import atomic_write_text
from slime_ext.rollout.problems import SPLITS, PromptRecord

__all__ = [
    "MANIFEST_FORMAT",
    "SplitManifest",
    "assign_splits",
    "build_manifest",
    "check_reportable",
    "default_manifest_path",
    "holdout_count",
    "inputs_digest",
    "is_holdout",
    "load_split_manifest",
    "parse_split_manifest",
    "pinned_splits",
    "split_of",
    "write_split_manifest",
]

MANIFEST_FORMAT = "kernel-rl-split/1"


def _order_key(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def holdout_count(n: int, ratio: float) -> int:
    """round(ratio * n), halves rounded up (Python's round() would round 2.5 to 2)."""
    return min(n, max(0, math.floor(ratio * n + 0.5)))


def assign_splits(
    items: Iterable[tuple[str, Any]],
    holdout_ratio: float,
    seed: int,
    pinned: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """key -> "train" | "holdout" for (key, stratum) pairs; see the module docstring for the rule.

    `pinned` (key -> split, e.g. from an earlier manifest) keeps those keys where they were: a
    problem once trained on never moves to holdout, a reported one never moves to train. The
    other keys of a stratum fill its holdout up to round(ratio * n) in the usual order.
    """
    if isinstance(holdout_ratio, bool) or not 0.0 <= float(holdout_ratio) <= 1.0:
        raise ValueError(f"holdout ratio must be within [0, 1], got {holdout_ratio!r}")
    pinned = dict(pinned or {})
    bad = sorted(k for k, v in pinned.items() if v not in SPLITS)
    if bad:
        raise ValueError(f"pinned split must be one of {SPLITS}; bad for {bad[:10]}")
    strata: dict[Any, list[str]] = {}
    seen: set[str] = set()
    for key, stratum in items:
        if key in seen:
            raise ValueError(f"duplicate key {key!r} in split input")
        seen.add(key)
        strata.setdefault(stratum, []).append(key)
    result: dict[str, str] = {}
    for keys in strata.values():
        free = sorted((k for k in keys if k not in pinned), key=lambda k: _order_key(seed, k))
        held = sum(1 for k in keys if pinned.get(k) == "holdout")
        n_holdout = max(0, holdout_count(len(keys), holdout_ratio) - held)
        for k in keys:
            if k in pinned:
                result[k] = pinned[k]
        for i, key in enumerate(free):
            result[key] = "holdout" if i < n_holdout else "train"
    return result


def pinned_splits(manifest: SplitManifest) -> dict[str, str]:
    """instance_id -> split of every problem an earlier manifest recorded."""
    return {**{i: "train" for i in manifest.train_ids}, **{i: "holdout" for i in manifest.holdout_ids}}


def inputs_digest(records: Iterable[PromptRecord]) -> str:
    """sha256 over the sorted (instance_id, level, problem_hash) triples: the split's input."""
    lines = sorted(f"{r.instance_id}\t{r.level}\t{r.problem_hash}\n" for r in records)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@dataclass(frozen=True)
class SplitManifest:
    seed: int
    holdout_ratio: float
    stratify_by: str
    inputs_sha256: str
    counts: dict[str, dict[str, int]]  # level (as a string) -> {"train": n, "holdout": m}
    holdout_ids: list[str]
    train_ids: list[str]
    problem_hashes: dict[str, str]  # instance_id -> problem_hash (sha256 of the reference)
    source: str = ""  # what the split was made from (input path as given)
    format: str = MANIFEST_FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "seed": self.seed,
            "holdout_ratio": self.holdout_ratio,
            "stratify_by": self.stratify_by,
            "inputs_sha256": self.inputs_sha256,
            "source": self.source,
            "counts": self.counts,
            "holdout_ids": self.holdout_ids,
            "train_ids": self.train_ids,
            "problem_hashes": self.problem_hashes,
            "extra": self.extra,
        }


def build_manifest(
    records: Sequence[PromptRecord], *, seed: int, holdout_ratio: float, source: str = ""
) -> SplitManifest:
    """The manifest of records that already carry their `split`."""
    counts: dict[str, dict[str, int]] = {}
    for r in records:
        level = counts.setdefault(str(r.level), {"train": 0, "holdout": 0})
        level[r.split] += 1
    return SplitManifest(
        seed=seed,
        holdout_ratio=holdout_ratio,
        stratify_by="level",
        inputs_sha256=inputs_digest(records),
        counts=dict(sorted(counts.items(), key=lambda kv: int(kv[0]))),
        holdout_ids=sorted(r.instance_id for r in records if r.split == "holdout"),
        train_ids=sorted(r.instance_id for r in records if r.split == "train"),
        problem_hashes={r.instance_id: r.problem_hash for r in sorted(records, key=lambda r: r.instance_id)},
        source=source,
    )


def default_manifest_path(output: str | os.PathLike[str]) -> Path:
    """`prompts.jsonl` -> `prompts.split.json` (beside the prompt file)."""
    p = Path(output)
    return p.with_name(f"{p.stem}.split.json")


def write_split_manifest(path: str | os.PathLike[str], manifest: SplitManifest) -> None:
    atomic_write_text(path, json.dumps(manifest.to_json(), indent=2, sort_keys=False) + "\n")


_MANIFEST_KEYS = {
    "format", "seed", "holdout_ratio", "stratify_by", "inputs_sha256", "source", "counts",
    "holdout_ids", "train_ids", "problem_hashes", "extra",
}  # fmt: skip


def _str_list(data: dict[str, Any], key: str, where: str) -> list[str]:
    value = data[key]
    check_type(f"{where}.{key}", value, list)
    for i, v in enumerate(value):
        check_type(f"{where}.{key}[{i}]", v, str)
    return list(value)


def parse_split_manifest(data: Any, where: str = "manifest") -> SplitManifest:
    """Validate a decoded manifest; every error names the field."""
    check_type(where, data, dict)
    reject_unknown(where, data, _MANIFEST_KEYS)
    missing = sorted(_MANIFEST_KEYS - {"source", "extra"} - set(data))
    if missing:
        raise ValidationError(f"{where}: missing field(s) {missing}")
    if data["format"] != MANIFEST_FORMAT:
        raise ValidationError(f"{where}.format: expected {MANIFEST_FORMAT!r}, got {data['format']!r}")
    check_type(f"{where}.seed", data["seed"], int)
    check_type(f"{where}.holdout_ratio", data["holdout_ratio"], int | float)
    for key in ("stratify_by", "inputs_sha256"):
        check_type(f"{where}.{key}", data[key], str)
    check_type(f"{where}.counts", data["counts"], dict)
    check_type(f"{where}.problem_hashes", data["problem_hashes"], dict)
    holdout = _str_list(data, "holdout_ids", where)
    train = _str_list(data, "train_ids", where)
    both = sorted(set(holdout) & set(train))
    if both:
        raise ValidationError(f"{where}: id(s) both in holdout_ids and train_ids: {both[:10]}")
    hashes = data["problem_hashes"]
    unhashed = sorted((set(holdout) | set(train)) - set(hashes))
    if unhashed:
        raise ValidationError(f"{where}.problem_hashes: no hash for {unhashed[:10]}")
    return SplitManifest(
        seed=data["seed"],
        holdout_ratio=float(data["holdout_ratio"]),
        stratify_by=data["stratify_by"],
        inputs_sha256=data["inputs_sha256"],
        counts=data["counts"],
        holdout_ids=holdout,
        train_ids=train,
        problem_hashes=dict(hashes),
        source=str(data.get("source", "")),
        extra=dict(data.get("extra", {})),
    )


def load_split_manifest(path: str | os.PathLike[str]) -> SplitManifest:
    """Read and validate a manifest file; errors name the file and the field."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"split manifest not found: {p}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{p}: not valid JSON ({exc.msg})") from None
    return parse_split_manifest(data, where=str(p))


def split_of(
    manifest: SplitManifest, instance_id: str | None = None, problem_hash: str | None = None
) -> str | None:
    """The split ("train" / "holdout") of a problem known to the manifest, None for an unknown one.

    By id, by content hash, or both; with both, a hash that differs from the recorded one raises
    ValidationError (the problem was edited after the split, so the split says nothing about it).
    """
    if instance_id is None and problem_hash is None:
        raise ValueError("split_of needs an instance_id or a problem_hash")
    if instance_id is not None:
        recorded = manifest.problem_hashes.get(instance_id)
        if recorded is None:
            return None
        if problem_hash is not None and problem_hash != recorded:
            raise ValidationError(
                f"{instance_id}: problem_hash {problem_hash[:12]}... differs from the split manifest's "
                f"{recorded[:12]}... (the problem changed after the split)"
            )
        return "holdout" if instance_id in set(manifest.holdout_ids) else "train"
    holdout_hashes = {manifest.problem_hashes[i] for i in manifest.holdout_ids}
    if problem_hash in holdout_hashes:
        return "holdout"
    return "train" if problem_hash in set(manifest.problem_hashes.values()) else None


def is_holdout(
    manifest: SplitManifest, instance_id: str | None = None, problem_hash: str | None = None
) -> bool:
    """True only for a problem the manifest puts in holdout (unknown problems are not)."""
    return split_of(manifest, instance_id, problem_hash) == "holdout"


def check_reportable(
    manifest: SplitManifest, records: Iterable[PromptRecord], *, allow_train: bool = False
) -> None:
    """Raise ValidationError unless every record is a holdout problem of the manifest.

    With `allow_train`, train problems pass, but problems unknown to the manifest (or edited since)
    still do not: a report must always be able to say which split each problem was in.
    """
    train: list[str] = []
    unknown: list[str] = []
    for r in records:
        split = split_of(manifest, r.instance_id, r.problem_hash)
        if split is None:
            unknown.append(r.instance_id)
        elif split == "train" and not allow_train:
            train.append(r.instance_id)
    problems = []
    if train:
        problems.append(
            f"{len(train)} train problem(s) {train[:10]} (trained on: pass allow_train to report them anyway)"
        )
    if unknown:
        problems.append(f"{len(unknown)} problem(s) not in the split manifest {unknown[:10]}")
    if problems:
        raise ValidationError("refusing to report: " + "; ".join(problems))
