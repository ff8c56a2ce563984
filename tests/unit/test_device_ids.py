"""--devices takes physical GPU ids; under a CUDA_VISIBLE_DEVICES that hides an id the server
refuses it instead of pinning a worker to a GPU the caller did not give (the worker's own
CUDA_VISIBLE_DEVICES is the physical id)."""

from __future__ import annotations

import pytest

from eval_server import __main__ as server_main

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_main, "gpu_names", dict)


def test_ids_inside_cuda_visible_devices_are_the_physical_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    slots = server_main.parse_slots("5", 2, 1)
    assert [(s.kind, s.index) for s in slots] == [("cuda", 5), ("cuda", 5)]


def test_an_id_outside_cuda_visible_devices_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(SystemExit, match=r"GPU 0 is not in CUDA_VISIBLE_DEVICES=1.*--devices 1"):
        server_main.parse_slots("0", 1, 1)


@pytest.mark.parametrize("visible", [None, "", "GPU-5f2c-uuid"])
def test_without_a_list_of_ids_every_id_is_taken(
    monkeypatch: pytest.MonkeyPatch, visible: str | None
) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [s.index for s in server_main.parse_slots("0,3", 1, 1)] == [0, 3]
