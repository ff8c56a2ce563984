"""Calibrate the evaluator's precision check (runtime.low_precision) on a real GPU.

For fp32 problems, how far from a float64 truth do outputs land when the math is done in
fp32 (torch, Triton ieee), tf32, fp16 or bf16? The check compares the candidate's normalized
error against the fp32 reference (max|out - ref| / max|ref|) with a floor and a multiple of the
reference's own float64 error; this probe prints every error against the float64 truth for matmuls, a reduction and an
elementwise op so the floor can sit between the 10-bit-mantissa formats (tf32, fp16: allowed)
and bf16 / fp8 (rejected).

  python bench/precision_probe.py            # needs a CUDA GPU
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, MODE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(
            a_ptr + rm[:, None] * K + (k + rk)[None, :],
            mask=(rm[:, None] < M) & ((k + rk)[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + (k + rk)[:, None] * N + rn[None, :],
            mask=((k + rk)[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        if MODE == 0:
            acc += tl.dot(a, b, input_precision="ieee")
        elif MODE == 1:
            acc += tl.dot(a, b, input_precision="tf32")
        elif MODE == 2:
            acc += tl.dot(a.to(tl.float16), b.to(tl.float16))
        elif MODE == 3:
            acc += tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
        else:
            acc += tl.dot(a, b, input_precision="tf32x3")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _rowsum_kernel(x_ptr, out_ptr, N, MODE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    acc16 = tl.zeros((BLOCK,), dtype=tl.float16)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
        if MODE == 0:
            acc += x
        elif MODE == 1:
            acc += x.to(tl.bfloat16).to(tl.float32)  # bf16 loads, fp32 accumulation
        else:
            acc16 += x.to(tl.float16)  # fp16 accumulation
    if MODE == 2:
        tl.store(out_ptr + row, tl.sum(acc16.to(tl.float32), axis=0))
    else:
        tl.store(out_ptr + row, tl.sum(acc, axis=0))


@triton.jit
def _gelu_tanh_kernel(x_ptr, out_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    if MODE == 1:
        x = x.to(tl.float16).to(tl.float32)
    elif MODE == 2:
        x = x.to(tl.bfloat16).to(tl.float32)
    y = 0.5 * x * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * (0.7978845608 * (x + 0.044715 * x * x * x)))) - 1.0))
    if MODE == 1:
        y = y.to(tl.float16).to(tl.float32)
    elif MODE == 2:
        y = y.to(tl.bfloat16).to(tl.float32)
    tl.store(out_ptr + offs, y, mask=offs < n)


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def nerr(out: torch.Tensor, truth: torch.Tensor) -> float:
    return float((out.double() - truth.double()).abs().max() / truth.double().abs().max())


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for m, k, n in [(512, 512, 512), (1024, 8192, 1024), (2048, 2048, 2048), (256, 32768, 256)]:
        a = torch.randn(m, k, device=dev)
        b = torch.randn(k, n, device=dev)
        truth = a.double() @ b.double()
        ref = a @ b
        ref_err = nerr(ref, truth)
        emulated = nerr(round_tf32(a) @ round_tf32(b), truth)  # the evaluator's "tf32" policy budget
        row = {"case": f"matmul {m}x{k}x{n}", "ref_vs_fp64": ref_err, "tf32_emulated_vs_fp64": emulated}
        for mode, name in enumerate(["ieee", "tf32", "fp16", "bf16", "tf32x3"]):
            c = torch.empty(m, n, device=dev)
            _matmul_kernel[(triton.cdiv(m, 64), triton.cdiv(n, 64))](
                a, b, c, m, n, k, MODE=mode, BM=64, BN=64, BK=32
            )
            row[name] = nerr(c, truth)
        rows.append(row)
    for r, n in [(4096, 4096), (128, 65536)]:
        x = torch.randn(r, n, device=dev)
        truth = x.double().sum(1)
        ref = x.sum(1)
        row = {"case": f"rowsum {r}x{n}", "ref_vs_fp64": nerr(ref, truth)}
        for mode, name in enumerate(["fp32", "bf16_loads", "fp16_accum"]):
            out = torch.empty(r, device=dev)
            _rowsum_kernel[(r,)](x, out, n, MODE=mode, BLOCK=1024)
            row[name] = nerr(out, truth)
        rows.append(row)
    x = torch.randn(1 << 24, device=dev) * 3
    ref = torch.nn.functional.gelu(x, approximate="tanh")
    truth = torch.nn.functional.gelu(x.double(), approximate="tanh")
    row = {"case": "gelu_tanh 16M", "ref_vs_fp64": nerr(ref, truth)}
    for mode, name in enumerate(["fp32", "fp16_io", "bf16_io"]):
        out = torch.empty_like(x)
        _gelu_tanh_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), MODE=mode, BLOCK=1024)
        row[name] = nerr(out, truth)
    rows.append(row)
    for row in rows:
        print(json.dumps({k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in row.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
