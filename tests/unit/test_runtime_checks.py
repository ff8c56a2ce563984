"""Unit tests of eval_server.checks.runtime: TorchOpRecorder and NamespaceSnapshot.

LaunchRecorder.install() patches Triton's JIT classes for the whole process, so it is not called
here; only the parts that need no patching are tested (counting, recording flag).
"""

from __future__ import annotations

import types

import pytest
import torch

from eval_server.checks.runtime import (
    ALLOWED_ATEN_OPS,
    LaunchRecorder,
    NamespaceSnapshot,
    TorchOpRecorder,
    default_guarded_namespaces,
)

pytestmark = pytest.mark.unit


@pytest.fixture()
def x():
    return torch.randn(4, 4, generator=torch.Generator().manual_seed(0))


def record(fn) -> TorchOpRecorder:
    with TorchOpRecorder() as rec:
        fn()
    return rec


# --------------------------------------------------------------------------- TorchOpRecorder


def test_allocation_views_and_copies_are_allowed(x):
    def body():
        out = torch.empty_like(x)
        torch.empty(3)
        torch.zeros(2, 2)
        torch.empty_strided((2, 2), (2, 1))
        v = x.view(16).reshape(2, 8)
        x.t().contiguous()
        x[1:].unsqueeze(0)
        out.copy_(x)
        x.clone()
        torch.cat([v, v])
        return out

    rec = record(body)
    assert rec.compute_ops() == {}
    assert rec.ops["empty_like"] == 1 and rec.ops["copy_"] == 1  # they were seen, just allowed


@pytest.mark.parametrize(
    "fn, op",
    [
        (lambda x: x + 1, "add"),
        (lambda x: x.clamp(min=0), "clamp"),
        (lambda x: torch.mm(x, x), "mm"),
        (lambda x: x @ x, "mm"),
        (lambda x: torch.relu(x), "relu"),
        (lambda x: x.sum(), "sum"),
    ],
)
def test_compute_is_reported(x, fn, op):
    rec = record(lambda: fn(x))
    assert rec.compute_ops() == {op: 1}


def test_in_place_compute_is_reported_under_its_own_name(x):
    y = x.clone()
    rec = record(lambda: y.add_(1))
    assert rec.compute_ops() == {"add_": 1}


def test_counts_and_mixed_ops(x):
    def body():
        out = torch.empty_like(x)
        for _ in range(3):
            out = out + x
        return torch.mm(out, x).clamp(min=0)

    rec = record(body)
    assert rec.compute_ops() == {"add": 3, "clamp": 1, "mm": 1}
    assert list(rec.compute_ops()) == sorted(rec.compute_ops())


def test_nothing_recorded_outside_the_block(x):
    rec = TorchOpRecorder()
    with rec:
        pass
    _ = x + 1
    assert rec.compute_ops() == {} and sum(rec.ops.values()) == 0


def test_results_are_correct_under_the_mode(x):
    with TorchOpRecorder():
        y = (x + 1).clamp(min=0)
    assert torch.equal(y, (x + 1).clamp(min=0))


def test_trailing_underscore_variants_of_allowed_ops_are_allowed():
    rec = TorchOpRecorder()
    rec.ops.update({"zero_": 2, "fill_": 1, "view": 4, "mul_": 1, "_to_copy": 1})
    assert rec.compute_ops() == {"mul_": 1}


def test_allowed_set_excludes_math():
    for op in ("add", "mul", "mm", "clamp", "relu", "sum", "addmm", "exp"):
        assert op not in ALLOWED_ATEN_OPS


# --------------------------------------------------------------------------- NamespaceSnapshot


def make_namespace() -> types.ModuleType:
    ns = types.ModuleType("fake_torch")
    ns.isclose = lambda a, b: a == b
    ns.synchronize = lambda: None
    ns.CONSTANT = 3
    return ns


def test_unchanged_namespace_reports_nothing():
    ns = make_namespace()
    snap = NamespaceSnapshot([("fake", ns)])
    ns.isclose(1, 1)  # using attributes is not changing them
    assert snap.changed() == []


def test_replaced_attribute_is_reported():
    ns = make_namespace()
    snap = NamespaceSnapshot([("fake", ns)])
    ns.isclose = lambda a, b: True
    assert snap.changed() == ["fake.isclose"]


def test_deleted_attribute_is_reported():
    ns = make_namespace()
    snap = NamespaceSnapshot([("fake", ns)])
    del ns.synchronize
    assert snap.changed() == ["fake.synchronize"]


def test_reassigning_the_same_object_is_not_a_change():
    ns = make_namespace()
    original = ns.isclose
    snap = NamespaceSnapshot([("fake", ns)])
    ns.isclose = original
    assert snap.changed() == []


def test_added_attribute_is_not_reported():
    ns = make_namespace()
    snap = NamespaceSnapshot([("fake", ns)])
    ns.extra = object()
    assert snap.changed() == []


def test_replacement_detected_even_when_original_was_freed():
    # The original's only reference is the namespace; once replaced it is freed and CPython
    # readily hands its address (its id) to the next object of the same size.
    misses = 0
    for _ in range(200):
        ns = types.SimpleNamespace(fn=object())
        snap = NamespaceSnapshot([("ns", ns)])
        ns.fn = None
        ns.fn = object()
        misses += snap.changed() != ["ns.fn"]
    assert misses == 0


def test_several_namespaces_and_classes():
    ns = make_namespace()

    class Timer:
        def elapsed(self):
            return 1.0

    snap = NamespaceSnapshot([("fake", ns), ("Timer", Timer)])
    Timer.elapsed = lambda self: 0.0
    ns.CONSTANT = 4
    assert sorted(snap.changed()) == ["Timer.elapsed", "fake.CONSTANT"]


def test_snapshot_of_real_torch_is_clean_without_patching():
    snap = NamespaceSnapshot([("torch", torch), ("torch.Tensor", torch.Tensor)])
    with TorchOpRecorder():  # entering a dispatch mode must not look like a patch
        _ = torch.ones(2) + 1
    assert snap.changed() == []


def test_the_evaluators_own_helpers_and_classes_are_guarded(monkeypatch):
    """A candidate could replace a helper the evaluator looks up at call time (compare._tensor_close:
    every output matches) or a method of one of its classes (TorchOpRecorder.compute_ops)."""
    import eval_server.checks.compare
    import eval_server.pipeline.evaluate  # noqa: F401 - loads the evaluator's modules, as in a worker

    snap = NamespaceSnapshot(default_guarded_namespaces())
    assert snap.changed() == []
    monkeypatch.setattr(eval_server.checks.compare, "_tensor_close", lambda ref, cand, tol: (True, 0.0, 0.0))
    monkeypatch.setattr(TorchOpRecorder, "compute_ops", lambda self: {})
    assert snap.changed() == [
        "eval_server.checks.compare._tensor_close",
        "eval_server.checks.runtime.TorchOpRecorder.compute_ops",
    ]


# --------------------------------------------------------------------------- LaunchRecorder (no install)


def test_launch_recorder_counting_and_recording_flag():
    rec = LaunchRecorder()
    assert rec.count == 0 and not rec.active
    with rec.recording() as same:
        assert same is rec and rec.active
    assert not rec.active
    rec.launches.update({"k1": 2, "k2": 1})
    assert rec.count == 3
    rec.reset()
    assert rec.count == 0


def test_launch_recorder_flag_cleared_on_error():
    rec = LaunchRecorder()
    with pytest.raises(RuntimeError), rec.recording():
        raise RuntimeError("boom")
    assert not rec.active


# --------------------------------------------------------------------------- classify_kernels


def test_classify_kernels_separates_triton_copies_foreign_and_host_copies():
    from eval_server.checks.runtime import classify_kernels

    names = [
        "relu_kernel",  # the candidate's Triton kernel (CUDA name = function name)
        "relu_kernel_0d1d2de",  # older Triton suffixes
        "void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda(...)>",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>",
        "Memset (Device)",
        "Memcpy HtoD (Pageable -> Device)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::clamp_min_scalar_kernel_impl(...)>",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1",
        "Memcpy DtoH (Device -> Pageable)",
    ]
    foreign, to_host = classify_kernels(names, {"relu_kernel": 1})
    assert foreign == [names[6], names[7]]
    assert to_host == [names[8]]


def test_a_triton_kernel_name_claims_no_library_kernel_it_prefixes():
    """A Triton kernel may be named anything: `sm90` or `void` must not make cuBLAS's or ATen's
    kernels (whose names they prefix) the candidate's own."""
    from eval_server.checks.runtime import classify_kernels, is_triton_kernel

    gemm = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1"
    aten = "void at::native::vectorized_elementwise_kernel<4, at::native::clamp_min_scalar_kernel_impl(...)>"
    foreign, _ = classify_kernels([gemm, aten, "sm90", "void_0d1d"], {"sm90": 1, "void": 1})
    assert foreign == [gemm, aten]
    assert is_triton_kernel("relu_kernel", ["relu_kernel"]) and is_triton_kernel(
        "relu_kernel_0d1d2de", ["relu_kernel"]
    )
    assert not is_triton_kernel("relu_kernel_impl", ["relu_kernel"]) and not is_triton_kernel(
        "relu", ["relu_kernel"]
    )


def test_classify_kernels_without_triton_launches_flags_everything_computational():
    from eval_server.checks.runtime import classify_kernels

    foreign, to_host = classify_kernels(["ampere_sgemm_128x64_nn"], {})
    assert foreign == ["ampere_sgemm_128x64_nn"] and to_host == []


def test_crash_summary_keeps_error_lines_and_drops_stack_frames():
    from eval_server.workers.worker import crash_summary

    log = "\n".join(
        ["SPY start", "terminate called after throwing an instance of 'c10::AcceleratorError'",
         "  what():  CUDA error: an illegal memory access was encountered"]
        + [f"frame #{i}: /usr/lib/libtorch.so() [0x{i:x}]" for i in range(40)]
    )  # fmt: skip
    summary = crash_summary(log)
    assert "illegal memory access" in summary and "terminate called" in summary
    assert "frame #" not in summary
