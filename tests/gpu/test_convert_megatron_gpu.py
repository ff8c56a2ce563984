"""GPU proof of the converters: megatron-core's own GPTModel (local layer spec, no Transformer
Engine) loads our torch_dist checkpoint through `megatron.core.dist_checkpointing.load` and gives
the logits transformers gives on the same tokens, at TP=1 and TP=2.

The HF models are tiny random ones of each architecture (slime_ext/convert/tiny_models.py),
converted on the CPU by `hf_to_megatron` with the vocabulary padded for the TP size. After the
comparison each worker saves the loaded model with `dist_checkpointing.save` (megatron-core's own
torch_dist writer and chunking at that TP size), and `megatron_to_hf` must turn that back into the
original HF tensors bit for bit. The model is
built from the flags `megatron_args_from_hf_config` generates (the configs/models/*.sh generator),
parsed back into megatron-core's TransformerConfig and GPTModel arguments. The Megatron side runs
in a `torch.distributed.run` subprocess (this file is also the worker); rank 0 also runs the HF
model and reports the maximum relative error max|l_mcore - l_hf| / max|l_hf| per case.

Needs megatron-core (tested target: 0.16.1) importable, e.g.
  pip install --no-index --no-deps --target /tmp/site .whl-megatron/*.whl
  PYTHONPATH=/tmp/site python3 -m pytest -m gpu tests/gpu/test_convert_megatron_gpu.py -v -s
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # worker: make the repository importable without installing it
    sys.path.insert(0, str(REPO))

from safetensors.torch import load_file  # noqa: E402

from slime_ext.convert import hf_to_megatron, megatron_to_hf  # noqa: E402
from slime_ext.convert.hf_io import read_hf_config  # noqa: E402
from slime_ext.convert.megatron_args import megatron_args_from_hf_config  # noqa: E402
from slime_ext.convert.tiny_models import write_tiny_hf_model  # noqa: E402

pytestmark = pytest.mark.gpu

# max relative error allowed: fp32 runs differ only by kernel order; bf16 by bf16 rounding
# of activations between the two implementations.
TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SEQ = 48


def _flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]], i = argv[i + 1], i + 2
        else:
            out[argv[i]], i = None, i + 1
    return out


def _build_model(hf_dir: Path, tp: int, dtype: torch.dtype, padded_vocab: int):  # -> GPTModel
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    f = _flags(megatron_args_from_hf_config(read_hf_config(hf_dir)))
    assert "--swiglu" in f and f["--normalization"] == "RMSNorm" and "--disable-bias-linear" in f
    heads = int(f["--num-attention-heads"])
    config = TransformerConfig(
        num_layers=int(f["--num-layers"]),
        hidden_size=int(f["--hidden-size"]),
        ffn_hidden_size=int(f["--ffn-hidden-size"]),
        num_attention_heads=heads,
        num_query_groups=int(f["--num-query-groups"]) if "--group-query-attention" in f else heads,
        kv_channels=int(f["--kv-channels"]),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias="--add-qkv-bias" in f,
        normalization="RMSNorm",
        layernorm_epsilon=float(f["--norm-epsilon"]),
        qk_layernorm="--qk-layernorm" in f,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=padded_vocab,
        max_sequence_length=int(f["--max-position-embeddings"]),
        parallel_output=False,
        share_embeddings_and_output_weights="--untie-embeddings-and-output-weights" not in f,
        position_embedding_type="rope",
        rotary_base=int(f["--rotary-base"]),
        rope_scaling="--use-rope-scaling" in f,
        rope_scaling_factor=float(f.get("--rope-scaling-factor") or 8.0),
    )
    return model.cuda().eval()


def worker(cases_path: Path, out_path: Path) -> None:
    """torch.distributed.run entry: load every case's checkpoint into megatron-core, compare."""
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    results = []
    for case in json.loads(cases_path.read_text()):
        dtype = DTYPES[case["dtype"]]
        model = _build_model(Path(case["hf_dir"]), world, dtype, case["padded_vocab"])
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))  # anything the checkpoint does not set stays NaN
        sharded = model.sharded_state_dict()
        loaded = dist_checkpointing.load(sharded, case["ckpt_dir"])
        # load() merges common.pt (checkpoint_version, iteration, and the run's args as Megatron's
        # save_checkpoint keeps them: slime_ext/convert/layout.py) into what it returns.
        extra = set(loaded) - set(sharded)
        assert extra in ({"checkpoint_version", "iteration"}, {"checkpoint_version", "iteration", "args"}), (
            extra
        )
        state = {k: v for k, v in loaded.items() if k in sharded}
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        assert not missing and not unexpected, (missing, unexpected)
        gen = torch.Generator().manual_seed(7)
        tokens = torch.randint(0, case["vocab"], (2, SEQ), generator=gen).cuda()
        positions = torch.arange(SEQ).unsqueeze(0).expand(2, -1).cuda()
        with torch.no_grad():
            logits = model(tokens, positions, attention_mask=None).float()[..., : case["vocab"]]
        if rank == 0:
            hf = AutoModelForCausalLM.from_pretrained(
                case["hf_dir"], dtype=dtype, attn_implementation="eager"
            )
            with torch.no_grad():
                ref = hf.cuda().eval()(tokens).logits.float()
            err = ((logits - ref).abs().max() / ref.abs().max()).item()
            results.append({**case, "tp": world, "max_rel_err": err, "nan": bool(logits.isnan().any())})
            del hf
        # Save the loaded model with megatron-core itself: the test converts that back to HF.
        save_dir = Path(case["mcore_save_dir"])
        if rank == 0:
            save_dir.mkdir(parents=True)
        torch.distributed.barrier()
        dist_checkpointing.save(model.sharded_state_dict(), str(save_dir))
        torch.distributed.barrier()
        del model, sharded, state, loaded
        torch.cuda.empty_cache()
    if rank == 0:
        out_path.write_text(json.dumps(results, indent=2))
    torch.distributed.barrier()
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _need(ngpu: int) -> None:
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron.core is not importable")
    if not torch.cuda.is_available() or torch.cuda.device_count() < ngpu:
        pytest.skip(f"needs {ngpu} CUDA GPU(s)")


CASES = {
    1: [
        ("qwen3", "fp32"),
        ("qwen3_tied", "fp32"),
        ("qwen2", "fp32"),
        ("llama", "fp32"),
        ("qwen3", "bf16"),
        ("qwen2", "bf16"),
    ],
    2: [("qwen3", "fp32"), ("qwen3_tied", "fp32"), ("qwen2", "fp32"), ("llama", "fp32"), ("qwen3", "bf16")],
}


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_logits_match_transformers(tmp_path: Path, tp: int) -> None:
    _need(tp)
    cases = []
    for kind, dt in CASES[tp]:
        hf_dir = write_tiny_hf_model(kind, tmp_path / f"{kind}-{dt}-hf", DTYPES[dt])
        ckpt_root = tmp_path / f"{kind}-{dt}-tp{tp}"
        hf_to_megatron(hf_dir, ckpt_root, vocab_multiple=128 * tp, progress=False)
        vocab = read_hf_config(hf_dir)["vocab_size"]
        cases.append(
            {
                "kind": kind,
                "dtype": dt,
                "hf_dir": str(hf_dir),
                "ckpt_dir": str(ckpt_root / "release"),
                "vocab": vocab,
                "padded_vocab": -(-vocab // (128 * tp)) * 128 * tp,
                "mcore_save_dir": str(tmp_path / f"{kind}-{dt}-mcore-saved-tp{tp}"),
            }
        )
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={tp}",
            __file__,
            "--cases",
            str(tmp_path / "cases.json"),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    results = json.loads(out.read_text())
    assert len(results) == len(cases)
    for r in results:
        print(f"TP={r['tp']} {r['kind']:<10} {r['dtype']}: max relative logit error {r['max_rel_err']:.2e}")
    for r in results:
        assert not r["nan"], r
        assert r["max_rel_err"] < TOLERANCE[r["dtype"]], r
    # What megatron-core saved (its own chunking at this TP size) converts back bit-exact. A bf16
    # model keeps its torch RMSNorm weights in fp32, so the output is cast to the HF dtype.
    for case in cases:
        back = tmp_path / f"{case['kind']}-{case['dtype']}-back"
        megatron_to_hf(
            Path(case["mcore_save_dir"]),
            back,
            Path(case["hf_dir"]),
            dtype=DTYPES[case["dtype"]],
            progress=False,
        )
        want, got = (
            load_file(Path(case["hf_dir"]) / "model.safetensors"),
            load_file(back / "model.safetensors"),
        )
        assert got.keys() == want.keys(), case
        for name, t in want.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), (case["kind"], name)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--cases", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    worker(a.cases, a.out)
