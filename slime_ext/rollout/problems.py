"""The prompt record: one problem of the RL prompt data (jsonl, one record per line).

This is the one definition of that format (DESIGN.md "Prompt record"); data preparation writes
it, the agent runner, the slime plug-ins and the evaluation tools read it.

Fields:
- `instance_id` (str): the GRPO group key; unique in a file (e.g. `kb_L1_019`).
- `level` (int >= 1): KernelBench level (1 single ops ... 4 whole models); drives the curriculum.
- `problem_id` (str): the problem's id within its source (e.g. `19_ReLU`), used in reports.
- `name` (str): human-readable name.
- `reference` (str): the problem source (`Model`, `get_inputs`, `get_init_inputs`).
- `split` (str): `train` or `holdout`; reports refuse `train` problems unless told.
- `problem_hash` (str): sha256 of `reference` (the eval server's `problem_hash`); checked on read.
- `metadata` (object): free-form JSON (source path, tags, ...).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval_server.schema import problem_hash
from krl_common.fileio import atomic_output
from krl_common.validation import ValidationError, check_type, reject_unknown

__all__ = [
    "SPLITS",
    "PromptRecord",
    "iter_prompt_records",
    "load_prompt_records",
    "parse_prompt_record",
    "write_prompt_records",
]

SPLITS = ("train", "holdout")


@dataclass(frozen=True)
class PromptRecord:
    instance_id: str
    level: int
    problem_id: str
    name: str
    reference: str
    split: str = "train"
    problem_hash: str = ""  # filled from `reference` when empty
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.problem_hash:
            object.__setattr__(self, "problem_hash", problem_hash(self.reference))

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "level": self.level,
            "problem_id": self.problem_id,
            "name": self.name,
            "reference": self.reference,
            "split": self.split,
            "problem_hash": self.problem_hash,
            "metadata": self.metadata,
        }


_REQUIRED = ("instance_id", "level", "problem_id", "name", "reference")
_ALLOWED = {*_REQUIRED, "split", "problem_hash", "metadata"}


def parse_prompt_record(data: Any, *, path: str = "") -> PromptRecord:
    """Validate one decoded JSON object; raises ValidationError naming the bad field."""
    check_type(path or "record", data, dict)
    reject_unknown(path, data, _ALLOWED)
    for name in _REQUIRED:
        if name not in data:
            raise ValidationError(f"{path}{'.' if path else ''}{name}: missing required field")
    p = f"{path}." if path else ""
    for name in ("instance_id", "problem_id", "name", "reference"):
        check_type(p + name, data[name], str)
        if not data[name].strip():
            raise ValidationError(f"{p}{name}: must not be empty")
    level = data["level"]
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise ValidationError(f"{p}level: expected an integer >= 1, got {level!r}")
    split = data.get("split", "train")
    if split not in SPLITS:
        raise ValidationError(f"{p}split: expected one of {', '.join(SPLITS)}, got {split!r}")
    metadata = data.get("metadata", {})
    check_type(p + "metadata", metadata, dict)
    digest = problem_hash(data["reference"])
    given = data.get("problem_hash")
    if given is not None:
        check_type(p + "problem_hash", given, str)
        if given != digest:
            raise ValidationError(f"{p}problem_hash: does not match the sha256 of reference (edited source?)")
    return PromptRecord(
        instance_id=data["instance_id"],
        level=level,
        problem_id=data["problem_id"],
        name=data["name"],
        reference=data["reference"],
        split=split,
        problem_hash=digest,
        metadata=metadata,
    )


def iter_prompt_records(path: str | os.PathLike[str]) -> Iterator[PromptRecord]:
    """Records of a jsonl file in order; errors name the file and line. Blank lines are skipped."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"prompt data not found: {p}")
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValidationError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
            try:
                yield parse_prompt_record(data)
            except ValidationError as exc:
                raise ValidationError(f"{p}:{lineno}: {exc}") from None


def load_prompt_records(path: str | os.PathLike[str]) -> list[PromptRecord]:
    """All records of a jsonl file; duplicate `instance_id`s are an error (they are group keys)."""
    records = list(iter_prompt_records(path))
    seen: set[str] = set()
    for r in records:
        if r.instance_id in seen:
            raise ValidationError(f"{path}: duplicate instance_id {r.instance_id!r}")
        seen.add(r.instance_id)
    return records


def write_prompt_records(path: str | os.PathLike[str], records: Iterable[PromptRecord]) -> int:
    """Write jsonl atomically (temporary file + rename): a failed run leaves no partial file."""
    n = 0
    with atomic_output(path) as f:
        for r in records:
            f.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n
