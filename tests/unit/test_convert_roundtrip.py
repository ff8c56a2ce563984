"""HF -> torch_dist -> HF is bit-exact on tiny random models of every supported architecture;
the torch_dist output is a valid DCP checkpoint for torch's own reader, with Megatron's layout."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from slime_ext.convert import hf_to_megatron, megatron_to_hf
from slime_ext.convert.arch import megatron_tensors, padded_vocab_size, spec_from_hf_config
from slime_ext.convert.dcp_reader import DcpReader
from slime_ext.convert.dcp_writer import DcpWriter
from slime_ext.convert.layout import write_checkpoint_files
from slime_ext.convert.tiny_models import write_tiny_hf_model

pytestmark = pytest.mark.unit


def load_hf(d: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def dcp_state(ckpt: Path) -> dict[str, torch.Tensor]:
    """Read every tensor with torch.distributed.checkpoint itself (no process group)."""
    meta = DcpReader(ckpt).metadata.state_dict_metadata
    sd = {
        k: torch.full(tuple(v.size), float("nan"), dtype=v.properties.dtype)
        for k, v in meta.items()
        if hasattr(v, "size")
    }
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(sd, checkpoint_id=str(ckpt), no_dist=True)
    return sd


def expected_qkv(
    hf: dict[str, torch.Tensor], layer: int, heads: int, groups: int, d: int, what: str
) -> torch.Tensor:
    """Per-group order built head by head: group g = its q heads, then k head g, then v head g."""
    q, k, v = (hf[f"model.layers.{layer}.self_attn.{p}_proj.{what}"] for p in "qkv")
    n = heads // groups
    rows = []
    for g in range(groups):
        rows += [q[(g * n + i) * d : (g * n + i + 1) * d] for i in range(n)]
        rows += [k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]]
    return torch.cat(rows)


CASES = [
    ("qwen3", torch.bfloat16, 1),
    ("qwen3_tied", torch.bfloat16, 2),
    ("qwen2", torch.bfloat16, 1),
    ("llama", torch.bfloat16, 4),
    ("qwen3", torch.float32, 2),
    ("qwen2", torch.float32, 1),
]


@pytest.mark.parametrize("kind,dtype,tp", CASES, ids=[f"{k}-{str(d)[6:]}-tp{t}" for k, d, t in CASES])
def test_round_trip_bit_exact(tmp_path: Path, kind: str, dtype: torch.dtype, tp: int) -> None:
    hf_dir = write_tiny_hf_model(
        kind, tmp_path / "hf", dtype, max_shard_size="100KB" if kind == "qwen2" else None
    )
    hf = load_hf(hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    spec = spec_from_hf_config(config)
    multiple = 128 * tp
    hf_to_megatron(hf_dir, tmp_path / "mg", vocab_multiple=multiple, progress=False, max_file_bytes=64 << 10)

    root = tmp_path / "mg"
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "release"
    ckpt = root / "release"
    assert json.loads((ckpt / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    with torch.serialization.safe_globals([argparse.Namespace]):  # as megatron-core registers it
        common = torch.load(ckpt / "common.pt", weights_only=True)
    assert set(common) == {"args", "checkpoint_version", "iteration"}
    assert (common["checkpoint_version"], common["iteration"]) == (3.0, 0)
    assert common["args"].padded_vocab_size == padded_vocab_size(spec.vocab_size, multiple)
    assert len(list(ckpt.glob("__0_*.distcp"))) > 1  # the small file limit rotated data files

    sd = dcp_state(ckpt)
    padded = padded_vocab_size(spec.vocab_size, multiple)
    assert padded % multiple == 0 and padded >= spec.vocab_size
    L, H = spec.num_layers, spec.hidden_size
    emb = sd["embedding.word_embeddings.weight"]
    assert emb.shape == (padded, H) and emb.dtype == dtype
    assert torch.equal(emb[: spec.vocab_size], hf["model.embed_tokens.weight"])
    assert not emb[spec.vocab_size :].any()
    assert ("output_layer.weight" in sd) == (kind != "qwen3_tied")
    for layer in range(L):
        qkv = sd["decoder.layers.self_attention.linear_qkv.weight"][layer]
        assert torch.equal(
            qkv,
            expected_qkv(hf, layer, spec.num_attention_heads, spec.num_query_groups, spec.head_dim, "weight"),
        )
        if kind == "qwen2":
            assert torch.equal(
                sd["decoder.layers.self_attention.linear_qkv.bias"][layer],
                expected_qkv(
                    hf, layer, spec.num_attention_heads, spec.num_query_groups, spec.head_dim, "bias"
                ),
            )
        fc1 = sd["decoder.layers.mlp.linear_fc1.weight"][layer]
        gate, up = (
            hf[f"model.layers.{layer}.mlp.gate_proj.weight"],
            hf[f"model.layers.{layer}.mlp.up_proj.weight"],
        )
        assert torch.equal(fc1, torch.cat([gate, up]))
        assert torch.equal(
            sd["decoder.layers.self_attention.linear_qkv.layer_norm_weight"][layer],
            hf[f"model.layers.{layer}.input_layernorm.weight"],
        )
        assert torch.equal(
            sd["decoder.layers.mlp.linear_fc1.layer_norm_weight"][layer],
            hf[f"model.layers.{layer}.post_attention_layernorm.weight"],
        )
    assert ("decoder.layers.self_attention.q_layernorm.weight" in sd) == kind.startswith("qwen3")
    for mt in megatron_tensors(spec, padded):
        assert tuple(sd[mt.key].shape) == mt.global_shape(L)
    objects = [k for k, v in DcpReader(ckpt).metadata.state_dict_metadata.items() if not hasattr(v, "size")]
    assert "decoder.layers.self_attention.linear_qkv._extra_state/shard_1_2" in objects

    megatron_to_hf(root, tmp_path / "hf2", hf_dir, progress=False, max_shard_bytes=150_000)
    back = load_hf(tmp_path / "hf2")
    assert back.keys() == hf.keys()
    for name, t in hf.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    assert (tmp_path / "hf2" / "config.json").read_bytes() == (hf_dir / "config.json").read_bytes()
    if (hf_dir / "model.safetensors.index.json").exists():
        index = json.loads((tmp_path / "hf2" / "model.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == set(hf)
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in hf.values())


def test_dtype_cast_and_iteration_dir(tmp_path: Path) -> None:
    hf_dir = write_tiny_hf_model("llama", tmp_path / "hf", torch.float32)
    hf = load_hf(hf_dir)
    hf_to_megatron(
        hf_dir, tmp_path / "mg", dtype=torch.bfloat16, iteration=42, te_extra_state=False, progress=False
    )
    assert (tmp_path / "mg" / "latest_checkpointed_iteration.txt").read_text() == "42"
    ckpt = tmp_path / "mg" / "iter_0000042"
    with torch.serialization.safe_globals([argparse.Namespace]):
        assert torch.load(ckpt / "common.pt", weights_only=True)["iteration"] == 42
    reader = DcpReader(ckpt)
    assert {reader.dtype(k) for k in reader.tensor_keys()} == {torch.bfloat16}
    assert not [k for k in reader.metadata.state_dict_metadata if "_extra_state" in k]
    megatron_to_hf(ckpt, tmp_path / "hf2", hf_dir, dtype=torch.float32, progress=False)
    back = load_hf(tmp_path / "hf2")
    for name, t in hf.items():
        assert torch.equal(back[name], t.to(torch.bfloat16).to(torch.float32)), name


def _tp_chunks(key: str, shape: tuple[int, ...], tp: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(offsets, sizes) of the chunks Megatron saves at tensor-parallel size tp for one key."""

    def split(axis: int, frags: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        step = shape[axis] // frags
        return [
            (
                tuple(i * step if a == axis else 0 for a in range(len(shape))),
                tuple(step if a == axis else s for a, s in enumerate(shape)),
            )
            for i in range(frags)
        ]

    if key.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return split(len(shape) - 1, tp)  # row-parallel: input dim
    if key.endswith("linear_fc1.weight"):
        return split(0, 2 * tp)  # SwiGLU: gate and up are sharded separately
    if key.endswith(("linear_qkv.weight", "linear_qkv.bias")):
        return split(0, tp)
    if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return split(0, tp)
    return [((0,) * len(shape), shape)]


def test_reads_tensor_parallel_chunking(tmp_path: Path) -> None:
    """A checkpoint chunked as Megatron saves it at TP=2, one chunk per layer per rank (and gate/up
    fragments for fc1), converts back to the same HF tensors."""
    hf_dir = write_tiny_hf_model("qwen2", tmp_path / "hf", torch.bfloat16)
    hf_to_megatron(hf_dir, tmp_path / "mg", vocab_multiple=256, te_extra_state=False, progress=False)
    src = DcpReader(tmp_path / "mg" / "release")
    out = tmp_path / "tp2" / "iter_0000007"
    out.mkdir(parents=True)
    writer = DcpWriter(out)
    for key in src.tensor_keys():
        shape = src.shape(key)
        writer.declare(key, shape, src.dtype(key))
        full = src.read(key, (0,) * len(shape), shape)
        layers = range(shape[0]) if key.startswith("decoder.layers.") else [None]
        for layer in layers:
            sub = shape[1:] if layer is not None else shape
            for offs, sizes in _tp_chunks(key, sub, 2):
                index = tuple(slice(o, o + s) for o, s in zip(offs, sizes, strict=True))
                if layer is None:
                    writer.write_chunk(key, offs, full[index].clone())
                else:
                    writer.write_chunk(key, (layer, *offs), full[layer][index].unsqueeze(0).clone())
    writer.finish()
    write_checkpoint_files(tmp_path / "tp2", out, 7)
    assert (
        len(DcpReader(out).metadata.state_dict_metadata["decoder.layers.mlp.linear_fc1.weight"].chunks) == 8
    )
    megatron_to_hf(tmp_path / "tp2", tmp_path / "hf2", hf_dir, progress=False)
    hf, back = load_hf(hf_dir), load_hf(tmp_path / "hf2")
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def _saved_window(t: torch.Tensor, tmp_path: Path) -> tuple[object, object]:
    from slime_ext.convert.dcp_reader import _FileSlice

    path = tmp_path / "t.pt"
    with open(path, "wb") as fh:
        fh.write(b"x" * 100)  # the record starts mid-file, as chunks in a .distcp do
        torch.save(t, fh)
    fh = open(path, "rb")  # noqa: SIM115 (closed by the caller through the returned handle)
    return fh, _FileSlice(fh, 100, path.stat().st_size - 100)


def test_raw_chunk_reads_only_plain_tensors(tmp_path: Path) -> None:
    """The direct read path takes compact contiguous tensors and nothing else (views of a larger
    storage, transposed or offset tensors, other dtypes go through torch.load)."""
    from slime_ext.convert.dcp_reader import _raw_data_offset

    base = torch.randn(6, 4).to(torch.bfloat16)
    fh, window = _saved_window(base, tmp_path)
    start = _raw_data_offset(window, (6, 4), torch.bfloat16)
    assert start is not None
    window.seek(start)
    assert window.read(base.nbytes) == base.view(torch.uint8).numpy().tobytes()
    assert _raw_data_offset(window, (6, 4), torch.float32) is None
    assert _raw_data_offset(window, (4, 6), torch.bfloat16) is None
    fh.close()
    for other, shape in ((base[3:], (3, 4)), (base.t(), (4, 6)), (base[:3], (3, 4))):
        fh, window = _saved_window(other, tmp_path)
        assert _raw_data_offset(window, shape, torch.bfloat16) is None
        fh.close()


def test_reader_fills_the_given_buffer(tmp_path: Path) -> None:
    writer = DcpWriter(tmp_path)
    full = torch.randn(3, 5, 2)
    writer.declare("w", (3, 5, 2), torch.float32)
    for layer in range(3):
        writer.write_chunk("w", (layer, 0, 0), full[layer : layer + 1].clone())
    writer.finish()
    reader = DcpReader(tmp_path)
    buf = torch.empty(1, 5, 2)
    for layer in range(3):
        got = reader.read("w", (layer, 0, 0), (1, 5, 2), out=buf)
        assert got is buf and torch.equal(got[0], full[layer])
    assert torch.equal(reader.read("w", (0, 0, 0), (3, 5, 2)), full)
