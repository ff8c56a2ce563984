"""An eval-fleet actor claims one of its node's eval GPUs (KRL_EVAL_GPU_IDS) with a lock file:
two actors never share a GPU, a freed GPU is claimed again, and a node without the list says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slime_ext.cluster.eval_fleet import EVAL_GPU_IDS, claim_gpu, namespace

pytestmark = pytest.mark.unit


def test_claims_are_distinct_and_released_with_their_descriptor(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(EVAL_GPU_IDS, "2, 3")
    first, fd1 = claim_gpu("run-1", tmp_path)
    second, fd2 = claim_gpu("run-1", tmp_path)
    assert {first, second} == {"2", "3"}
    with pytest.raises(RuntimeError, match="already serves run run-1"):
        claim_gpu("run-1", tmp_path)
    os.close(fd1)  # the actor holding it died
    again, fd3 = claim_gpu("run-1", tmp_path)
    assert again == first
    os.close(fd2)
    os.close(fd3)


def test_a_node_without_eval_gpu_ids_says_so(monkeypatch) -> None:
    monkeypatch.delenv(EVAL_GPU_IDS, raising=False)
    with pytest.raises(RuntimeError, match="KRL_EVAL_GPU_IDS is not set"):
        claim_gpu("run-1")


@pytest.mark.parametrize("bad", ["", "a b", "x/y"])
def test_run_ids_are_checked(bad: str) -> None:
    with pytest.raises(ValueError):
        namespace(bad)
