"""HF safetensors <-> Megatron torch_dist, one tensor at a time.

`hf_to_megatron` reads one HF tensor at a time, builds the Megatron tensor (fused QKV, stacked
gate/up, padded vocabulary), and appends it to the DCP files as one chunk per layer;
`megatron_to_hf` reads each layer's region back from whatever chunks the checkpoint has (any TP
layout) and streams the split tensors into safetensors shards. Both write under a temporary name
and rename when complete.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from slime_ext.convert.arch import (
    MegatronTensor,
    ModelSpec,
    fill_megatron,
    hf_part_shapes,
    megatron_tensors,
    padded_vocab_size,
    spec_from_hf_config,
    te_extra_state_keys,
    to_hf,
)
from slime_ext.convert.dcp_reader import DcpReader
from slime_ext.convert.dcp_writer import DcpWriter
from slime_ext.convert.errors import ConvertError
from slime_ext.convert.hf_io import HFReader, SafetensorsWriter, TensorPlan, read_hf_config
from slime_ext.convert.layout import (
    atomic_output_dir,
    checkpoint_subdir,
    resolve_checkpoint_dir,
    write_checkpoint_files,
)
from slime_ext.convert.megatron_args import checkpoint_args

__all__ = ["ConvertStats", "hf_to_megatron", "megatron_to_hf", "HF_SIDE_FILES_SKIPPED"]

# Tensors an HF checkpoint may carry that have no Megatron counterpart (recomputed buffers).
_IGNORED_HF = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
# Weight files of the source HF dir that megatron_to_hf does not copy beside the new weights.
HF_SIDE_FILES_SKIPPED = re.compile(
    r".*\.(safetensors|bin|pt|pth|ckpt|h5|msgpack)$|model\.safetensors\.index\.json$|"
    r"pytorch_model\.bin\.index\.json$"
)


@dataclass(frozen=True)
class ConvertStats:
    tensors: int
    bytes_written: int


def _layers(spec: ModelSpec, mt: MegatronTensor) -> list[int | None]:
    return list(range(spec.num_layers)) if mt.per_layer else [None]


def _tensor_nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return int(torch.Size(shape).numel()) * dtype.itemsize


def _check_hf_names(spec: ModelSpec, reader: HFReader, tensors: list[MegatronTensor]) -> None:
    expected = {n for mt in tensors for layer in _layers(spec, mt) for n in mt.hf_for_layer(layer)}
    present = set(reader.names())
    missing = sorted(expected - present)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ConvertError(f"{reader.dir}: tensors missing for {spec.architecture}: {missing[:5]}{more}")
    extra = sorted(
        n
        for n in present - expected
        if not _IGNORED_HF.fullmatch(n) and not (spec.tie_word_embeddings and n == "lm_head.weight")
    )
    if extra:
        raise ConvertError(
            f"{reader.dir}: unexpected tensors for {spec.architecture} "
            f"(tie_word_embeddings={spec.tie_word_embeddings}): {extra[:5]}"
        )


def _read_megatron_tensor(
    spec: ModelSpec,
    mt: MegatronTensor,
    layer: int | None,
    reader: HFReader,
    buffers: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor],
) -> torch.Tensor:
    """One layer's Megatron tensor, read from the HF files straight into a buffer reused across
    layers (and shared by tensors of one shape, e.g. embedding and lm_head)."""
    names = mt.hf_for_layer(layer)
    for name, shape in zip(names, hf_part_shapes(spec, mt), strict=True):
        if reader.shape(name) != shape:
            raise ConvertError(
                f"{name}: expected shape {shape} for {spec.architecture}, got {reader.shape(name)}"
            )
    dtypes = {reader.dtype(n) for n in names}
    if len(dtypes) != 1 or None in dtypes:
        raise ConvertError(f"{names}: mixed or unsupported dtypes {sorted(map(str, dtypes))}")
    key = (mt.shape, dtypes.pop())
    if key not in buffers:
        buffers[key] = torch.empty(key[0], dtype=key[1])
    return fill_megatron(
        spec, mt, buffers[key], lambda part, first, dest: reader.read_rows(names[part], first, dest)
    )


def hf_to_megatron(
    hf_dir: Path,
    out_dir: Path,
    *,
    vocab_multiple: int = 128,
    tp: int = 1,
    dtype: torch.dtype | None = None,
    iteration: int | None = None,
    te_extra_state: bool = True,
    overwrite: bool = False,
    max_file_bytes: int = 4 << 30,
    progress: bool = True,
) -> ConvertStats:
    """Convert an HF directory into a Megatron checkpoint root (`release/` unless `iteration`).

    `vocab_multiple` is make_vocab_size_divisible_by x TP (128 x TP by default in Megatron); `tp`
    is the TP size it was computed for, recorded with the model arguments in common.pt;
    `dtype` None keeps the source dtype."""
    if tp < 1 or vocab_multiple % tp:
        raise ConvertError(f"vocab_multiple {vocab_multiple} is not a multiple of tp {tp}")
    hf_dir = Path(hf_dir)
    spec = spec_from_hf_config(read_hf_config(hf_dir))
    reader = HFReader(hf_dir)
    padded = padded_vocab_size(spec.vocab_size, vocab_multiple)
    tensors = megatron_tensors(spec, padded)
    _check_hf_names(spec, reader, tensors)
    written = 0
    with atomic_output_dir(out_dir, overwrite) as root:
        ckpt = root / checkpoint_subdir(iteration)
        ckpt.mkdir()
        writer = DcpWriter(ckpt, max_file_bytes)
        total = sum(
            _tensor_nbytes(
                mt.global_shape(spec.num_layers),
                dtype or reader.dtype(mt.hf_for_layer(0)[0]) or torch.float32,
            )
            for mt in tensors
        )
        bar = tqdm(total=total, unit="B", unit_scale=True, desc="hf->torch_dist", disable=not progress)
        try:
            buffers: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
            for mt in tensors:
                for layer in _layers(spec, mt):
                    value = _read_megatron_tensor(spec, mt, layer, reader, buffers)
                    target = dtype or value.dtype
                    if layer == 0 or layer is None:
                        writer.declare(mt.key, mt.global_shape(spec.num_layers), target)
                    value = value.to(target)
                    if layer is None:
                        writer.write_chunk(mt.key, (0,) * value.dim(), value)
                    else:
                        writer.write_chunk(mt.key, (layer,) + (0,) * value.dim(), value.unsqueeze(0))
                    written += value.numel() * value.element_size()
                    bar.update(value.numel() * value.element_size())
                    del value
            if te_extra_state:
                # TE modules serialise "no FP8 state" as None; Megatron stores ShardedObjects as
                # torch.save([data, ...]) under `<key>/shard_<offset>_<shape>`.
                for key, per_layer in te_extra_state_keys(spec):
                    if per_layer:
                        for layer in range(spec.num_layers):
                            writer.write_object(f"{key}/shard_{layer}_{spec.num_layers}", [None])
                    else:
                        writer.write_object(f"{key}/shard_0_1", [None])
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        finally:
            bar.close()
            reader.close()
        args = checkpoint_args(
            spec,
            padded_vocab_size=padded,
            make_vocab_size_divisible_by=vocab_multiple // tp,
            tensor_model_parallel_size=tp,
        )
        write_checkpoint_files(root, ckpt, iteration, args)
    return ConvertStats(len(tensors), written)


def _copy_side_files(hf_config_dir: Path, out_dir: Path) -> None:
    for src in sorted(Path(hf_config_dir).iterdir()):
        if src.is_file() and not HF_SIDE_FILES_SKIPPED.fullmatch(src.name):
            shutil.copy2(src, out_dir / src.name)


def _check_checkpoint(spec: ModelSpec, reader: DcpReader, tensors: list[MegatronTensor]) -> None:
    for mt in tensors:
        shape = reader.shape(mt.key)
        if shape != mt.global_shape(spec.num_layers):
            raise ConvertError(
                f"{mt.key}: checkpoint shape {shape} does not match the HF config "
                f"({spec.architecture}): expected {mt.global_shape(spec.num_layers)}"
            )


def megatron_to_hf(
    ckpt_path: Path,
    out_dir: Path,
    hf_config_dir: Path,
    *,
    vocab_size: int | None = None,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 5 << 30,
    overwrite: bool = False,
    progress: bool = True,
) -> ConvertStats:
    """Convert a torch_dist checkpoint (root or release/iter dir) to an HF directory.

    The architecture, config and tokenizer come from `hf_config_dir` (every file but weights is
    copied); the vocabulary is cut to `vocab_size` (default: the config's)."""
    config = read_hf_config(Path(hf_config_dir))
    if vocab_size is not None:
        config = {**config, "vocab_size": vocab_size}
    spec = spec_from_hf_config(config)
    reader = DcpReader(resolve_checkpoint_dir(Path(ckpt_path)))
    emb = "embedding.word_embeddings.weight"
    padded = reader.shape(emb)[0]
    if padded < spec.vocab_size:
        raise ConvertError(f"{emb} has {padded} rows, fewer than vocab_size {spec.vocab_size}")
    tensors = megatron_tensors(spec, padded)
    _check_checkpoint(spec, reader, tensors)

    def out_dtype(mt: MegatronTensor) -> torch.dtype:
        return dtype or reader.dtype(mt.key)

    # HF order: embeddings, then layer by layer, then the final norm and lm_head.
    steps: list[tuple[MegatronTensor, int | None]] = [(t, None) for t in tensors if t.key == emb]
    steps += [(t, layer) for layer in range(spec.num_layers) for t in tensors if t.per_layer]
    steps += [(t, None) for t in tensors if not t.per_layer and t.key != emb]
    plan: list[TensorPlan] = []
    for mt, layer in steps:
        names = mt.hf_for_layer(layer)
        shapes = hf_part_shapes(spec, mt)
        plan += [TensorPlan(n, out_dtype(mt), s) for n, s in zip(names, shapes, strict=True)]
    written = 0
    with atomic_output_dir(out_dir, overwrite) as tmp:
        writer = SafetensorsWriter(tmp, plan, max_shard_bytes)
        bar = tqdm(
            total=writer.total_bytes, unit="B", unit_scale=True, desc="torch_dist->hf", disable=not progress
        )
        try:
            buffers: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
            for mt, layer in steps:
                region = mt.shape if layer is None else (1, *mt.shape)
                key = (region, reader.dtype(mt.key))
                if key not in buffers:  # reused for every layer: no fresh pages per read
                    buffers[key] = torch.empty(key[0], dtype=key[1])
                offsets = (0,) * len(mt.shape) if layer is None else (layer,) + (0,) * len(mt.shape)
                value = reader.read(mt.key, offsets, region, out=buffers[key])
                if layer is not None:
                    value = value[0]
                for name, part in zip(mt.hf_for_layer(layer), to_hf(spec, mt, value), strict=True):
                    part = part.to(out_dtype(mt))
                    writer.write(name, part)
                    written += part.numel() * part.element_size()
                    bar.update(part.numel() * part.element_size())
                del value
            writer.close()
        except BaseException:
            writer.abort()
            raise
        finally:
            bar.close()
        _copy_side_files(Path(hf_config_dir), tmp)
    return ConvertStats(len(plan), written)
