"""KernelBook rows -> KernelBench reference + ModelNew answer; answer checks; dedup key."""

from __future__ import annotations

import pytest

from bench.synthetic_data import (
    ADD_PY,
    LINEAR_TRITON,
    SCALED_RELU_PY,
    SCALED_RELU_TRITON,
    add_triton,
    on_cuda,
)
from krl_common.validation import ValidationError
from slime_ext.data.kernelbench import check_problem_source
from slime_ext.data.kernelbook import (
    KernelBookRow,
    Rejected,
    answer_rejection,
    canonical_hash,
    launched_kernels,
    parse_kernelbook_row,
    to_answer,
    to_reference,
)

pytestmark = pytest.mark.unit


def _row(py: str, tr: str = SCALED_RELU_TRITON, entry: str = "ScaledRelu") -> KernelBookRow:
    return KernelBookRow(key="k", entry_point=entry, python_code=py, triton_code=tr)


def test_reference_becomes_kernelbench():
    ref = to_reference(_row(SCALED_RELU_PY))
    check_problem_source(ref, "ref")
    assert "class Model(nn.Module):" in ref and "super(Model, self).__init__()" in ref
    assert "def get_init_inputs():\n    return [3.0]\n" in ref
    assert '"""relu(x) * scale"""' in ref  # everything else as written


@pytest.mark.parametrize(
    ("init", "expected"),
    [
        ("[[0.5], {'beta': 2.0}]", "[0.5, 2.0]"),
        ("[[0.5], {}]", "[0.5]"),
        ("[[], {'alpha': 1, 'beta': 3}]", "[1, 3]"),
        ("[[], {'beta': 3, 'alpha': 1}]", "[1, 3]"),
        ("[]", "[]"),
    ],
)
def test_init_inputs_keywords_to_positions(init, expected):
    py = ADD_PY.replace("[[0.5], {'beta': 2.0}]", init)
    ref = to_reference(_row(py, add_triton(), "PairAdd"))
    assert f"def get_init_inputs():\n    return {expected}\n" in ref


def test_init_inputs_fill_gap_with_default():
    py = ADD_PY.replace("def __init__(self, alpha, beta=1.0):", "def __init__(self, alpha, mid=7, beta=1.0):")
    ref = to_reference(_row(py, add_triton(), "PairAdd"))
    assert "return [0.5, 7, 2.0]" in ref


@pytest.mark.parametrize(
    ("init", "reason"),
    [
        ("[[0.5], {'gamma': 1}]", "keyword-only or unknown argument"),
        ("[[], {'beta': 1}]", "argument 'alpha' has no value and no default"),
        ("make_inputs()", "must return a list literal"),
        ("[1, 2]", "not KernelBook's"),
    ],
)
def test_init_inputs_unsupported(init, reason):
    py = ADD_PY.replace("[[0.5], {'beta': 2.0}]", init)
    with pytest.raises(Rejected, match=reason) as info:
        to_reference(_row(py, add_triton(), "PairAdd"))
    assert info.value.reason == "init_inputs_unsupported"


def test_reference_rejections():
    with pytest.raises(Rejected) as info:
        to_reference(_row("class X(:\n"))
    assert info.value.reason == "reference_syntax"
    with pytest.raises(Rejected) as info:
        to_reference(_row(SCALED_RELU_PY, entry="Other"))
    assert info.value.reason == "reference_no_entry_class"
    with pytest.raises(Rejected) as info:
        to_reference(_row(SCALED_RELU_PY + "\nclass Model:\n    pass\n"))
    assert info.value.reason == "reference_name_clash"
    with pytest.raises(Rejected) as info:
        to_reference(_row(SCALED_RELU_PY.replace("def get_inputs", "def make_inputs")))
    assert info.value.reason == "reference_not_kernelbench"


def test_answer_becomes_modelnew_and_passes_checks():
    answer = to_answer(_row(SCALED_RELU_PY))
    assert "class ModelNew(nn.Module):" in answer and "super(ModelNew, self)" in answer
    assert "ScaledReluNew" not in answer
    assert launched_kernels(answer) == ["triton_poi_fused_mul_relu_0"]
    assert answer_rejection(answer) is None


def test_cuda_layout_answer_converts():
    """Real KernelBook answers allocate on CUDA under a device guard; that layout converts too."""
    answer = to_answer(_row(SCALED_RELU_PY, on_cuda(SCALED_RELU_TRITON)))
    assert "with torch.cuda._DeviceGuard(0):" in answer and "def empty_strided_cuda(" in answer
    assert 'device="cuda"' in answer and "torch._C" not in answer
    assert answer_rejection(answer) is None


def test_answer_class_fallback_and_rejections():
    renamed = SCALED_RELU_TRITON.replace("ScaledReluNew", "SomethingNew")
    assert "class ModelNew" in to_answer(_row(SCALED_RELU_PY, renamed))
    with pytest.raises(Rejected) as info:
        to_answer(_row(SCALED_RELU_PY, SCALED_RELU_TRITON.replace("ScaledReluNew", "Other")))
    assert info.value.reason == "answer_no_new_class"
    with pytest.raises(Rejected) as info:
        to_answer(_row(SCALED_RELU_PY, SCALED_RELU_TRITON + "\nfrom torch._C import _secret\n"))
    assert info.value.reason == "answer_inductor_unsupported"
    with pytest.raises(Rejected) as info:
        to_answer(_row(SCALED_RELU_PY, "def f(:\n"))
    assert info.value.reason == "answer_syntax"


def test_answer_rejection_reasons():
    linear = to_answer(KernelBookRow("k", "TinyLinear", "", LINEAR_TRITON))
    assert answer_rejection(linear).reason == "answer_extern_kernels"
    assert answer_rejection(linear, allow_extern_kernels=True) is None
    answer = to_answer(_row(SCALED_RELU_PY))
    unlaunched = answer.replace("output = call([arg0_1])", "output = (arg0_1,)")
    assert answer_rejection(unlaunched).reason == "answer_no_launched_kernel"
    cheat = answer.replace("return output[0]", "return torch.relu(output[0])")
    assert answer_rejection(cheat).reason == "static:static.torch_compute"


def test_launched_kernels_follows_methods_and_helpers():
    src = """import triton
@triton.jit
def k1(x): pass
@triton.jit
def k2(x): pass
@triton.jit
def unused(x): pass
def launch(x):
    k2[(1,)](x)
class ModelNew:
    def forward(self, x):
        k1[(1,)](x)
        return self._more(x)
    def _more(self, x):
        launch(x)
"""
    assert launched_kernels(src) == ["k1", "k2"]
    assert launched_kernels(src, "Missing") == []


def test_parse_row():
    row = parse_kernelbook_row(
        {
            "uuid": 7,
            "entry_point": " A ",
            "python_code": "x",
            "triton_code": "y",
            "licenses": ["MIT"],
            "stars": 3,
        },
        0,
    )
    assert (row.key, row.entry_point, row.metadata) == ("7", "A", {"licenses": ["MIT"], "stars": 3})
    assert parse_kernelbook_row({"entry_point": "A", "python_code": "x", "triton_code": "y"}, 4).key == "row4"
    with pytest.raises(ValidationError, match=r"missing column\(s\) \['triton_code'\]"):
        parse_kernelbook_row({"entry_point": "A", "python_code": "x"}, 0, "kb.parquet")
    with pytest.raises(Rejected, match="'python_code' is empty"):
        parse_kernelbook_row({"entry_point": "A", "python_code": None, "triton_code": "y"}, 0)


def test_canonical_hash_ignores_docs_comments_format():
    a = 'class A:\n    """doc"""\n    x = 1  # note\n'
    b = "class A:\n\n    x = (1)\n"
    assert canonical_hash(a) == canonical_hash(b)
    assert canonical_hash(a) != canonical_hash("class A:\n    x = 2\n")
