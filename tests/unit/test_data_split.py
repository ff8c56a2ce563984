"""The seeded stratified split and its manifest (what the evaluation tool reads)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from krl_common.validation import ValidationError
from slime_ext.data.split import (
    assign_splits,
    build_manifest,
    check_reportable,
    default_manifest_path,
    holdout_count,
    is_holdout,
    load_split_manifest,
    split_of,
    write_split_manifest,
)
from slime_ext.rollout.problems import PromptRecord

pytestmark = pytest.mark.unit


def _items(per_level: dict[int, int]) -> list[tuple[str, int]]:
    return [(f"kb_L{lv}_{i:03d}", lv) for lv, n in per_level.items() for i in range(1, n + 1)]


def test_same_seed_same_split_independent_of_order():
    items = _items({1: 100, 2: 100, 3: 50, 4: 20})
    a = assign_splits(items, 0.2, seed=7)
    b = assign_splits(list(reversed(items)), 0.2, seed=7)
    assert a == b
    c = assign_splits(items, 0.2, seed=8)
    assert a != c  # another seed picks other problems
    assert Counter(a.values()) == Counter(c.values())


def test_stratified_and_ratio_respected():
    items = _items({1: 100, 2: 100, 3: 50, 4: 20})
    splits = assign_splits(items, 0.2, seed=0)
    per_level = Counter((lv, splits[k]) for k, lv in items)
    assert per_level[(1, "holdout")] == 20 and per_level[(1, "train")] == 80
    assert per_level[(2, "holdout")] == 20
    assert per_level[(3, "holdout")] == 10
    assert per_level[(4, "holdout")] == 4
    assert holdout_count(5, 0.5) == 3  # half up, not banker's rounding
    assert holdout_count(1, 0.2) == 0
    assert set(assign_splits(items, 0.0, 0).values()) == {"train"}
    assert set(assign_splits(items, 1.0, 0).values()) == {"holdout"}


def test_adding_problems_keeps_existing_order():
    """The order is per-problem hashing, so a larger level mostly keeps its old holdout."""
    small = assign_splits(_items({1: 50}), 0.2, seed=3)
    large = assign_splits(_items({1: 100}), 0.2, seed=3)
    kept = [k for k, s in small.items() if s == "holdout" and large[k] == "holdout"]
    assert len(kept) >= 5


def test_pinned_keys_keep_their_split():
    items = _items({1: 100, 2: 20})
    old = assign_splits(items[:50] + items[100:110], 0.2, seed=1)
    new = assign_splits(items, 0.2, seed=1, pinned=old)
    assert all(new[k] == v for k, v in old.items())
    per_level = Counter((lv, new[k]) for k, lv in items)
    assert per_level[(1, "holdout")] == 20 and per_level[(2, "holdout")] == 4  # filled up to the ratio
    # more pinned holdout problems than the ratio asks for: they stay, no new one is added
    heavy = {k: "holdout" for k, _ in items[:30]}
    result = assign_splits(items, 0.2, seed=1, pinned=heavy)
    assert Counter(result[k] for k, lv in items if lv == 1)["holdout"] == 30
    with pytest.raises(ValueError, match="pinned split must be one of"):
        assign_splits(items, 0.2, 1, pinned={"kb_L1_001": "test"})


def test_bad_split_input():
    with pytest.raises(ValueError, match="holdout ratio must be within"):
        assign_splits(_items({1: 3}), 1.5, 0)
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        assign_splits([("a", 1), ("a", 1)], 0.5, 0)


def _records(split_seed: int = 0) -> list[PromptRecord]:
    items = _items({1: 10, 2: 5})
    splits = assign_splits(items, 0.3, split_seed)
    return [
        PromptRecord(instance_id=k, level=lv, problem_id=k, name=k, reference=f"# {k}\n", split=splits[k])
        for k, lv in items
    ]


def test_manifest_round_trip_and_queries(tmp_path):
    records = _records()
    manifest = build_manifest(records, seed=0, holdout_ratio=0.3, source="fixture")
    assert manifest.counts == {"1": {"train": 7, "holdout": 3}, "2": {"train": 3, "holdout": 2}}
    path = default_manifest_path(tmp_path / "kb.jsonl")
    assert path.name == "kb.split.json"
    write_split_manifest(path, manifest)
    loaded = load_split_manifest(path)
    assert loaded == manifest
    hold = next(r for r in records if r.split == "holdout")
    train = next(r for r in records if r.split == "train")
    assert is_holdout(loaded, hold.instance_id)
    assert is_holdout(loaded, problem_hash=hold.problem_hash)
    assert not is_holdout(loaded, train.instance_id)
    assert split_of(loaded, "kb_L9_001") is None and not is_holdout(loaded, "kb_L9_001")
    with pytest.raises(ValidationError, match="differs from the split manifest"):
        split_of(loaded, hold.instance_id, problem_hash="0" * 64)
    # the inputs digest changes when any problem changes
    edited = [
        *records[:-1],
        PromptRecord(**{**records[-1].to_json(), "reference": "# edited\n", "problem_hash": ""}),
    ]
    assert build_manifest(edited, seed=0, holdout_ratio=0.3).inputs_sha256 != manifest.inputs_sha256


def test_check_reportable(tmp_path):
    records = _records()
    manifest = build_manifest(records, seed=0, holdout_ratio=0.3)
    holdout = [r for r in records if r.split == "holdout"]
    check_reportable(manifest, holdout)
    with pytest.raises(ValidationError, match=r"refusing to report: 10 train problem\(s\)"):
        check_reportable(manifest, records)
    check_reportable(manifest, records, allow_train=True)
    stranger = PromptRecord(instance_id="kb_L9_001", level=9, problem_id="x", name="x", reference="# x\n")
    with pytest.raises(ValidationError, match="not in the split manifest"):
        check_reportable(manifest, [stranger], allow_train=True)


def test_bad_manifests(tmp_path):
    manifest = build_manifest(_records(), seed=0, holdout_ratio=0.3).to_json()
    path = tmp_path / "m.json"

    def bad(data, match):
        path.write_text(json.dumps(data))
        with pytest.raises(ValidationError, match=match):
            load_split_manifest(path)

    bad({**manifest, "format": "other/9"}, "format: expected 'kernel-rl-split/1'")
    bad({**manifest, "surprise": 1}, r"unknown field\(s\) \['surprise'\]")
    bad({k: v for k, v in manifest.items() if k != "seed"}, r"missing field\(s\) \['seed'\]")
    bad({**manifest, "seed": "0"}, "seed: expected int")
    bad(
        {**manifest, "train_ids": [*manifest["train_ids"], manifest["holdout_ids"][0]]}, "both in holdout_ids"
    )
    bad({**manifest, "holdout_ids": [*manifest["holdout_ids"], "ghost"]}, r"no hash for \['ghost'\]")
    path.write_text("{")
    with pytest.raises(ValidationError, match="not valid JSON"):
        load_split_manifest(path)
    with pytest.raises(FileNotFoundError):
        load_split_manifest(tmp_path / "none.json")
