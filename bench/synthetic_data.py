"""Small local stand-ins for the datasets the data tools read (nothing can be downloaded here):
a KernelBench-style problem tree / HF-style table, and KernelBook-style rows whose Triton answers
follow the Inductor layout of the real dataset (`<Name>New` class, `call(args)`, guard aliases).
Used by the tests and by bench/data_prep.py (which is why it lives here: bench may not import tests)."""

from __future__ import annotations

import json
from pathlib import Path

# (file stem, torch op) per level: real KernelBench names, small shapes.
KB_LEVELS: dict[int, list[tuple[str, str]]] = {
    1: [
        ("19_ReLU", "torch.relu(x)"),
        ("20_LeakyReLU", "torch.nn.functional.leaky_relu(x, 0.01)"),
        ("21_Sigmoid", "torch.sigmoid(x)"),
        ("22_Tanh", "torch.tanh(x)"),
        ("23_Softmax", "torch.softmax(x, dim=1)"),
        ("24_LogSoftmax", "torch.log_softmax(x, dim=1)"),
        ("25_Swish", "x * torch.sigmoid(x)"),
        ("26_GELU_", "torch.nn.functional.gelu(x)"),
        ("27_SELU_", "torch.selu(x)"),
        ("28_HardSigmoid", "torch.nn.functional.hardsigmoid(x)"),
    ],
    2: [
        ("1_Conv2D_ReLU_BiasAdd", "torch.relu(x) + 1.0"),
        ("2_ConvTranspose2d_BiasAdd_Clamp", "torch.clamp(x + 0.5, 0.0, 1.0)"),
        ("3_Gemm_Scale_Tanh", "torch.tanh(x * 2.0)"),
        ("4_Conv2d_Mish_Mish", "x * torch.tanh(torch.nn.functional.softplus(x))"),
        ("5_Matmul_Sigmoid_Sum", "torch.sigmoid(x).sum(dim=1, keepdim=True)"),
    ],
    3: [
        ("1_MLP", "torch.relu(x).mean(dim=1, keepdim=True)"),
        ("2_ShallowWideMLP", "torch.relu(x) * 0.5"),
        ("3_DeepNarrowMLP", "torch.tanh(torch.relu(x))"),
    ],
}


def kb_source(stem: str, expr: str) -> str:
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench-style problem {stem}."""

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return {expr}


batch_size = 16
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''


def write_kernelbench_tree(root: Path, levels: dict[int, list[tuple[str, str]]] = KB_LEVELS) -> Path:
    """A checkout-like tree: root/KernelBench/level<N>/<id>_<Name>.py. Returns root."""
    for level, items in levels.items():
        folder = root / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True, exist_ok=True)
        for stem, expr in items:
            (folder / f"{stem}.py").write_text(kb_source(stem, expr), encoding="utf-8")
    return root


def kernelbench_rows(levels: dict[int, list[tuple[str, str]]] = KB_LEVELS) -> list[dict]:
    """Rows shaped like the HF dataset (code, level, name = file name, problem_id)."""
    return [
        {
            "code": kb_source(stem, expr),
            "level": level,
            "name": f"{stem}.py",
            "problem_id": int(stem.split("_")[0]),
        }
        for level, items in levels.items()
        for stem, expr in items
    ]


def write_kernelbench_hf(root: Path, fmt: str = "parquet") -> Path:
    """root/data/level_<N>-00000-of-00001.<fmt>, one file per level like the HF dataset."""
    import pyarrow as pa  # only here: GPU machines may lack pyarrow
    import pyarrow.parquet as pq

    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    rows = kernelbench_rows()
    for level in sorted({r["level"] for r in rows}):
        part = [r for r in rows if r["level"] == level]
        path = data / f"level_{level}-00000-of-00001.{fmt}"
        if fmt == "parquet":
            pq.write_table(pa.Table.from_pylist(part), path)
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    return root


# --------------------------------------------------------------------------- KernelBook

_KB_HEADER = """import torch
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import grid
from torch._C import _cuda_getCurrentRawStream as get_raw_stream
import torch.nn as nn
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
"""


def on_cuda(triton_code: str) -> str:
    """The answer as Inductor writes it for a GPU: CUDA allocation under a device guard (the
    fixtures' default allocates on the CPU so the CPU eval server can run them)."""
    out = triton_code.replace("empty_strided_cpu", "empty_strided_cuda")
    head, sep, body = out.partition("    args.clear()\n")
    if not sep:
        return out
    launcher, _, rest = body.partition("\n\n\n")
    lines = launcher.split("\n")
    guarded = [line for line in lines if line.startswith("    assert_size_stride")]
    work = [
        line
        for line in lines
        if not line.startswith("    assert_size_stride") and not line.startswith("    return")
    ]
    ret = [line for line in lines if line.startswith("    return")]
    block = ["    with torch.cuda._DeviceGuard(0):", "        torch.cuda.set_device(0)"]
    block += ["    " + line for line in work if line]
    return head + sep + "\n".join(guarded + block + ret) + "\n\n\n" + rest


SCALED_RELU_PY = '''import torch
import torch.nn as nn


class ScaledRelu(nn.Module):
    """relu(x) * scale"""

    def __init__(self, scale=2.0):
        super(ScaledRelu, self).__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.rand([4, 4, 4, 4])]


def get_init_inputs():
    return [[], {'scale': 3.0}]
'''

# Inductor layout (kernel, call(args), <Name>New); CPU allocation so it also runs in the interpreter.
SCALED_RELU_TRITON = (
    _KB_HEADER
    + '''

@triton.jit
def triton_poi_fused_mul_relu_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xnumel = 256
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + x0, xmask)
    tmp1 = 0.0
    tmp2 = tl.maximum(tmp0, tmp1)
    tmp3 = 3.0
    tmp4 = tmp2 * tmp3
    tl.store(out_ptr0 + x0, tmp4, xmask)


def call(args):
    arg0_1, = args
    args.clear()
    assert_size_stride(arg0_1, (4, 4, 4, 4), (64, 16, 4, 1))
    buf0 = empty_strided_cpu((4, 4, 4, 4), (64, 16, 4, 1), torch.float32)
    get_raw_stream(0)
    triton_poi_fused_mul_relu_0[grid(256)](arg0_1, buf0, 256, XBLOCK=128, num_warps=4, num_stages=1)
    del arg0_1
    return buf0,


class ScaledReluNew(nn.Module):
    """relu(x) * scale"""

    def __init__(self, scale=2.0):
        super(ScaledReluNew, self).__init__()
        self.scale = scale

    def forward(self, input_0):
        arg0_1 = input_0
        output = call([arg0_1])
        return output[0]
'''
)

ADD_PY = """import torch
import torch.nn as nn


class PairAdd(nn.Module):

    def __init__(self, alpha, beta=1.0):
        super().__init__()
        self.alpha = alpha
        self.beta = beta

    def forward(self, x, y):
        return x * self.alpha + y * self.beta


def get_inputs():
    return [torch.rand([8, 32]), torch.rand([8, 32])]


def get_init_inputs():
    return [[0.5], {'beta': 2.0}]
"""


def add_triton(alpha: str = "0.5", combine: str = "+") -> str:
    return (
        _KB_HEADER
        + f"""

@triton.jit
def triton_poi_fused_add_mul_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xnumel = 256
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + x0, xmask)
    tmp1 = {alpha}
    tmp2 = tmp0 * tmp1
    tmp3 = tl.load(in_ptr1 + x0, xmask)
    tmp4 = 2.0
    tmp5 = tmp3 * tmp4
    tmp6 = tmp2 {combine} tmp5
    tl.store(out_ptr0 + x0, tmp6, xmask)


def call(args):
    arg0_1, arg1_1 = args
    args.clear()
    assert_size_stride(arg0_1, (8, 32), (32, 1))
    assert_size_stride(arg1_1, (8, 32), (32, 1))
    buf0 = empty_strided_cpu((8, 32), (32, 1), torch.float32)
    get_raw_stream(0)
    triton_poi_fused_add_mul_0[grid(256)](arg0_1, arg1_1, buf0, 256, XBLOCK=64, num_warps=2, num_stages=1)
    del arg0_1
    del arg1_1
    return buf0,


class PairAddNew(nn.Module):

    def __init__(self, alpha, beta=1.0):
        super().__init__()
        self.alpha = alpha
        self.beta = beta

    def forward(self, input_0, input_1):
        arg0_1 = input_0
        arg1_1 = input_1
        output = call([arg0_1, arg1_1])
        return output[0]
"""
    )


LINEAR_PY = """import torch
import torch.nn as nn


class TinyLinear(nn.Module):

    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return torch.relu(self.fc(x))


def get_inputs():
    return [torch.rand([4, 4])]


def get_init_inputs():
    return [[], {'d': 4}]
"""

LINEAR_TRITON = (
    _KB_HEADER
    + """from torch._inductor.select_algorithm import extern_kernels


@triton.jit
def triton_poi_fused_relu_0(in_out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xnumel = 16
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    tmp0 = tl.load(in_out_ptr0 + xindex, xmask)
    tmp1 = tl.maximum(tmp0, 0.0)
    tl.store(in_out_ptr0 + xindex, tmp1, xmask)


def call(args):
    primals_1, primals_2, primals_3 = args
    buf0 = empty_strided_cpu((4, 4), (4, 1), torch.float32)
    extern_kernels.addmm(primals_2, primals_3, primals_1, alpha=1, beta=1, out=buf0)
    triton_poi_fused_relu_0[grid(16)](buf0, 16, XBLOCK=16)
    return buf0,


class TinyLinearNew(nn.Module):

    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, input_0):
        output = call([self.fc.weight, self.fc.bias, input_0])
        return output[0]
"""
)


def kernelbook_rows(device: str = "cpu") -> list[dict]:
    """Rows shaped like KernelBook's, one per outcome the SFT tool must tell apart; with
    device="cuda" the answers allocate on the GPU like real KernelBook rows."""

    def row(uuid: int, entry: str, py: str, tr: str, **extra: object) -> dict:
        if device == "cuda":
            tr = on_cuda(tr)
        return {
            "uuid": uuid,
            "entry_point": entry,
            "module_name": entry,
            "repo_name": f"someone/repo{uuid}",
            "licenses": ["MIT"],
            "synthetic": False,
            "python_code": py,
            "triton_code": tr,
            **extra,
        }

    not_launched = SCALED_RELU_TRITON.replace(
        "    triton_poi_fused_mul_relu_0[grid(256)](arg0_1, buf0, 256, XBLOCK=128, num_warps=4, num_stages=1)\n",
        "",
    )
    return [
        row(1, "ScaledRelu", SCALED_RELU_PY, SCALED_RELU_TRITON),  # kept
        row(2, "PairAdd", ADD_PY, add_triton()),  # kept
        row(3, "TinyLinear", LINEAR_PY, LINEAR_TRITON),  # answer_extern_kernels
        row(
            4,
            "ScaledRelu",
            SCALED_RELU_PY.replace('"""relu(x) * scale"""', '"""a fork"""'),
            SCALED_RELU_TRITON,
        ),
        row(5, "ScaledRelu", SCALED_RELU_PY, not_launched.replace("relu(x) * scale", "v2")),  # no launch
        row(6, "Broken", "class Broken(nn.Module:\n", SCALED_RELU_TRITON),  # reference_syntax
        row(7, "PairAdd", ADD_PY.replace("x * self.alpha", "x * self.alpha * 1.0"), add_triton(alpha="0.25")),
        row(8, "ScaledRelu", SCALED_RELU_PY + "\n# padding\n" * 500, SCALED_RELU_TRITON),  # too_long
        row(9, "Missing", SCALED_RELU_PY, SCALED_RELU_TRITON),  # reference_no_entry_class
        row(
            10,
            "ScaledRelu",
            SCALED_RELU_PY.replace("* self.scale", "* self.scale + 0.0"),
            SCALED_RELU_TRITON.replace("    return buf0,", "    return torch.relu(buf0),"),
        ),  # static:static.torch_compute
    ]


def write_word_tokenizer(path: Path) -> str:
    """A real (tiny) HF tokenizer dir: one token per word or punctuation run, a plain chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(path)
    return str(path)


# --------------------------------------------------------------------------- AI CUDA Engineer Archive
# Rows in the archive's layout (SakanaAI/AI-CUDA-Engineer-Archive, level_<N>.parquet), written
# for these tests: two KernelBench-style tasks, their functional forms, and CUDA extensions.

_RELU_TAIL = """

batch_size = 16
dim = 4096


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""
_LINEAR_SCALE_TAIL = """

batch_size = 32
in_features = 64
out_features = 48
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
"""

RELU_MODULE = (
    """import torch
import torch.nn as nn


class Model(nn.Module):
    \"\"\"Applies ReLU.\"\"\"

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)
"""
    + _RELU_TAIL
)

RELU_FUNCTIONAL = (
    """import torch
import torch.nn as nn
import torch.nn.functional as F


def module_fn(x: torch.Tensor) -> torch.Tensor:
    \"\"\"The PyTorch implementation.\"\"\"
    return F.relu(x)


class Model(nn.Module):
    \"\"\"Applies ReLU.\"\"\"

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor, fn=module_fn) -> torch.Tensor:
        return fn(x)
"""
    + _RELU_TAIL
)

_CUDA_HEAD = "#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n"
_BIND = '\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n    m.def("forward", &forward, "forward (CUDA)");\n}\n'

RELU_CUDA = (
    _CUDA_HEAD
    + """
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = fmaxf(x[i], 0.0f);
    }
}

torch::Tensor forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    if (n > 0) {
        relu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            xc.data_ptr<float>(), y.data_ptr<float>(), n);
    }
    return y;
}
"""
    + _BIND
)

RELU_CUDA_STRIDED = (
    _CUDA_HEAD
    + """
// grid-stride loop: a fixed grid covers any size
__global__ void relu_strided_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    if (n > 0) {
        relu_strided_kernel<<<128, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
            xc.data_ptr<float>(), y.data_ptr<float>(), n);
    }
    return y;
}
"""
    + _BIND
)

LINEAR_SCALE_MODULE = (
    """import torch
import torch.nn as nn


class Model(nn.Module):
    \"\"\"Linear layer, then a constant scale.\"\"\"

    def __init__(self, in_features, out_features, scale):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return self.linear(x) * self.scale
"""
    + _LINEAR_SCALE_TAIL
)

LINEAR_SCALE_FUNCTIONAL = (
    """import torch
import torch.nn as nn
import torch.nn.functional as F


def module_fn(x, weight, bias, scale):
    return F.linear(x, weight, bias) * scale


class Model(nn.Module):
    \"\"\"Linear layer, then a constant scale.\"\"\"

    def __init__(self, in_features, out_features, scale):
        super(Model, self).__init__()
        linear = nn.Linear(in_features, out_features)
        self.weight = nn.Parameter(linear.weight.clone())
        self.bias = nn.Parameter(linear.bias.clone())
        self.scale = scale

    def forward(self, x, fn=module_fn):
        return fn(x, self.weight, self.bias, self.scale)
"""
    + _LINEAR_SCALE_TAIL
)

LINEAR_SCALE_CUDA = (
    _CUDA_HEAD
    + """
__global__ void linear_scale_kernel(const float* x, const float* w, const float* b, float* y,
                                    int M, int N, int K, float scale) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) {
            acc += x[row * K + k] * w[col * K + k];
        }
        y[row * N + col] = (acc + b[col]) * scale;
    }
}

torch::Tensor forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double scale) {
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto y = torch::empty({M, N}, xc.options());
    dim3 threads(16, 16);
    dim3 blocks((N + 15) / 16, (M + 15) / 16);
    linear_scale_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), y.data_ptr<float>(),
        M, N, K, (float)scale);
    return y;
}
"""
    + _BIND
)

# torch::relu does the work: a kernel is launched, but the result comes from ATen.
RELU_CUDA_ATEN = RELU_CUDA.replace("return y;\n}", "return torch::relu(xc);\n}", 1)


def sakana_row(level: int, task: int, module: str, functional: str, cuda: str, **extra: object) -> dict:
    """One archive row (every column of the real archive; profiles left empty)."""
    row: dict = {
        "Op_Name": f"{task}_Task",
        "Level_ID": level,
        "Task_ID": task,
        "Kernel_Name": f"kernel_{task}",
        "CUDA_Runtime": 0.01,
        "PyTorch_Native_Runtime": 0.012,
        "PyTorch_Compile_Runtime": 0.02,
        "CUDA_Speedup_Native": 1.2,
        "CUDA_Speedup_Compile": 2.0,
        "CUDA_Code": cuda,
        "PyTorch_Code_Module": module,
        "PyTorch_Code_Functional": functional,
        "Correct": True,
        "Max_Diff": 1e-6,
        "Error": None,
        "NCU_Profile": None,
        "Torch_Profile": None,
        "Clang_Tidy": None,
        "__index_level_0__": 0,
    }
    row.update(extra)
    return row


def sakana_rows() -> list[dict]:
    """Rows 0..6: ReLU (L1 task 19) twice, a duplicate, an incorrect kernel, an ATen-calling one,
    Linear+scale (L2 task 7) with an unknown speedup, and a row without a kernel."""
    return [
        sakana_row(1, 19, RELU_MODULE, RELU_FUNCTIONAL, RELU_CUDA, CUDA_Speedup_Native=1.1),
        sakana_row(1, 19, RELU_MODULE, RELU_FUNCTIONAL, RELU_CUDA_STRIDED, CUDA_Speedup_Native=1.4),
        sakana_row(1, 19, RELU_MODULE, RELU_FUNCTIONAL, RELU_CUDA, CUDA_Speedup_Native=1.1),
        sakana_row(1, 19, RELU_MODULE, RELU_FUNCTIONAL, RELU_CUDA, Correct=False, Error="wrong"),
        sakana_row(1, 19, RELU_MODULE, RELU_FUNCTIONAL, RELU_CUDA_ATEN, CUDA_Speedup_Native=3.0),
        sakana_row(
            2,
            7,
            LINEAR_SCALE_MODULE,
            LINEAR_SCALE_FUNCTIONAL,
            LINEAR_SCALE_CUDA,
            CUDA_Speedup_Native=float("nan"),
        ),
        sakana_row(2, 7, LINEAR_SCALE_MODULE, LINEAR_SCALE_FUNCTIONAL, "// nothing here\n" + _BIND),
    ]


def write_sakana_archive(root: Path) -> Path:
    """The archive's file layout: one parquet file per level."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    rows = sakana_rows()
    for level in sorted({r["Level_ID"] for r in rows}):
        pq.write_table(
            pa.Table.from_pylist([r for r in rows if r["Level_ID"] == level]), root / f"level_{level}.parquet"
        )
    return root
