"""tools/prepare_kernelbench end to end, as a user runs it (a subprocess on a fixture tree)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.synthetic_data import write_kernelbench_hf, write_kernelbench_tree
from slime_ext.data.split import check_reportable, load_split_manifest
from slime_ext.rollout.problems import load_prompt_records

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.prepare_kernelbench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_prepare_from_tree_and_hf(tmp_path):
    tree = write_kernelbench_tree(tmp_path / "checkout")
    out = tmp_path / "out" / "kb.jsonl"
    proc = _run("--input", str(tree), "--output", str(out), "--holdout-ratio", "0.2", "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    records = load_prompt_records(out)
    manifest = load_split_manifest(tmp_path / "out" / "kb.split.json")
    assert len(records) == 18
    counts = Counter((r.level, r.split) for r in records)
    assert counts[(1, "holdout")] == 2 and counts[(2, "holdout")] == 1 and counts[(3, "holdout")] == 1
    assert manifest.counts["1"] == {"train": 8, "holdout": 2}
    assert sorted(r.instance_id for r in records if r.split == "holdout") == manifest.holdout_ids
    check_reportable(manifest, [r for r in records if r.split == "holdout"])
    assert "level" in proc.stdout and "wrote 18 prompt records" in proc.stdout

    # the HF files give byte-identical records and the same split for the same seed
    hf = write_kernelbench_hf(tmp_path / "hf")
    out2 = tmp_path / "out2.jsonl"
    assert (
        _run("--input", str(hf), "--output", str(out2), "--holdout-ratio", "0.2", "--seed", "5").returncode
        == 0
    )
    again = load_prompt_records(out2)
    assert [(r.instance_id, r.split, r.problem_hash) for r in again] == [
        (r.instance_id, r.split, r.problem_hash) for r in records
    ]
    assert load_split_manifest(tmp_path / "out2.split.json").inputs_sha256 == manifest.inputs_sha256

    # a level subset and an explicit manifest path
    out3 = tmp_path / "l1.jsonl"
    proc = _run(
        "--input", str(tree), "--output", str(out3), "--levels", "1", "--manifest", str(tmp_path / "m.json")
    )
    assert proc.returncode == 0, proc.stderr
    assert {r.level for r in load_prompt_records(out3)} == {1}
    assert list(load_split_manifest(tmp_path / "m.json").counts) == ["1"]


def test_split_from_keeps_an_earlier_split(tmp_path):
    tree = write_kernelbench_tree(tmp_path / "checkout")
    first = tmp_path / "v1.jsonl"
    assert _run("--input", str(tree), "--output", str(first), "--levels", "1", "--seed", "3").returncode == 0
    old = {r.instance_id: r.split for r in load_prompt_records(first)}
    relu = tree / "KernelBench" / "level1" / "19_ReLU.py"
    relu.write_text(relu.read_text().replace("batch_size = 16", "batch_size = 32"))
    second = tmp_path / "v2.jsonl"
    proc = _run(
        "--input", str(tree), "--output", str(second), "--split-from", str(tmp_path / "v1.split.json")
    )
    assert proc.returncode == 0, proc.stderr
    new = {r.instance_id: r.split for r in load_prompt_records(second)}
    assert {k: new[k] for k in old} == old  # nothing moved
    assert {k[:5] for k in new} == {"kb_L1", "kb_L2", "kb_L3"}
    manifest = load_split_manifest(tmp_path / "v2.split.json")
    assert manifest.seed == 3 and manifest.holdout_ratio == 0.2  # taken from the earlier manifest
    assert manifest.extra["pinned"] == 10 and manifest.extra["edited_since_split_from"] == ["kb_L1_019"]
    assert manifest.counts["2"]["holdout"] == 1 and manifest.counts["3"]["holdout"] == 1


def test_bad_input_leaves_nothing(tmp_path):
    tree = write_kernelbench_tree(tmp_path / "checkout")
    (tree / "KernelBench" / "level2" / "7_Bad.py").write_text("def get_inputs(:\n")
    out = tmp_path / "out" / "kb.jsonl"
    proc = _run("--input", str(tree), "--output", str(out))
    assert proc.returncode == 2
    assert "7_Bad.py: not valid Python" in proc.stderr
    assert not out.exists() and not (tmp_path / "out" / "kb.split.json").exists()
    proc = _run("--input", str(tree), "--output", str(out), "--holdout-ratio", "1.5")
    assert proc.returncode == 2 and "holdout ratio must be within [0, 1]" in proc.stderr
    proc = _run("--input", str(tree), "--output", str(out), "--levels", "x")
    assert proc.returncode == 2 and "levels must be comma-separated integers" in proc.stderr
