"""Inductor runtime glue -> public API: the rewritten helpers behave like Inductor's."""

from __future__ import annotations

import ast

import pytest
import torch

from bench.synthetic_data import SCALED_RELU_TRITON
from eval_server.pipeline.loader import import_source
from slime_ext.data.inductor import UnsupportedInductorCode, rewrite_inductor_glue

pytestmark = pytest.mark.unit


def _namespace(source: str, tmp_path) -> dict:
    """Import the rewritten module from a file (Triton's jit reads kernel source from files)."""
    return vars(import_source(source, tmp_path, "answer"))


def test_rewrite_removes_private_api_and_keeps_kernels():
    out = rewrite_inductor_glue(SCALED_RELU_TRITON)
    assert "torch._C" not in out and "triton_heuristics" not in out and "get_raw_stream" not in out
    for name in ("grid", "assert_size_stride", "empty_strided_cpu"):
        assert f"def {name}(" in out
    # the kernel and the launcher are byte-identical apart from the dropped raw-stream line
    kernel = SCALED_RELU_TRITON[SCALED_RELU_TRITON.index("@triton.jit") :].replace(
        "    get_raw_stream(0)\n", ""
    )
    assert out.endswith(kernel)
    ast.parse(out)


def test_helpers_behave_like_inductor(tmp_path):
    ns = _namespace(rewrite_inductor_glue(SCALED_RELU_TRITON), tmp_path)
    grid_fn = ns["grid"](256)
    assert grid_fn({"XBLOCK": 128}) == (2, 1, 1)
    assert ns["grid"](10, 7)({"XBLOCK": 4, "YBLOCK": 2}) == (3, 4, 1)
    assert ns["grid"](5)({}) == (5, 1, 1)
    t = ns["empty_strided_cpu"]((4, 4), (1, 4), torch.float32)
    assert t.shape == (4, 4) and t.stride() == (1, 4) and t.dtype == torch.float32
    ns["assert_size_stride"](torch.zeros(4, 1, 3), (4, 1, 3), (3, 99, 1))  # size-1 dims: any stride
    with pytest.raises(AssertionError, match="expected size"):
        ns["assert_size_stride"](torch.zeros(4, 3), (4, 3), (1, 4))
    with pytest.raises(AssertionError):
        ns["assert_size_stride"](torch.zeros(4, 3), (3, 4), (4, 1))


def test_assert_alignment(tmp_path):
    src = "import torch\nassert_alignment = torch._C._dynamo.guards.assert_alignment\n"
    check = _namespace(rewrite_inductor_glue(src), tmp_path)["assert_alignment"]
    base = torch.zeros(8)
    check(base, 4)
    with pytest.raises(AssertionError, match="aligned"):
        check(base[1:], 8)


def test_reinterpret_tensor_offsets_from_the_view(tmp_path):
    src = "import torch\nreinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor\n"
    ns = _namespace(rewrite_inductor_glue(src), tmp_path)
    base = torch.arange(12.0)
    view = base[2:]
    out = ns["reinterpret_tensor"](view, (2, 3), (3, 1), 1)
    assert out.tolist() == [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]


def test_unchanged_without_glue_and_unsupported_cases():
    plain = "import torch\n\ndef f():\n    return 1\n"
    assert rewrite_inductor_glue(plain) == plain
    with pytest.raises(UnsupportedInductorCode, match="guards._empty_strided_xpu"):
        rewrite_inductor_glue("import torch\nx = torch._C._dynamo.guards._empty_strided_xpu\n")
    with pytest.raises(UnsupportedInductorCode, match="from torch._C import _foo"):
        rewrite_inductor_glue("from torch._C import _foo\n")
    with pytest.raises(UnsupportedInductorCode, match="triton_heuristics.grid_combo_kernels"):
        rewrite_inductor_glue(
            "from torch._inductor.runtime.triton_heuristics import grid, grid_combo_kernels\n"
        )
    used = "import torch\nfrom torch._C import _cuda_getCurrentRawStream as get_raw_stream\ns = get_raw_stream(0)\n"
    with pytest.raises(UnsupportedInductorCode, match="raw CUDA stream handle is used"):
        rewrite_inductor_glue(used)


def test_only_statement_of_a_block_becomes_pass(tmp_path):
    src = (
        "import torch\nfrom torch._C import _cuda_getCurrentRawStream as get_raw_stream\n"
        "def f():\n    get_raw_stream(0)\n"
    )
    out = rewrite_inductor_glue(src)
    assert "def f():\n    pass\n" in out
    _namespace(out, tmp_path)["f"]()
