"""Checkpoint conversion speed and memory on a Qwen3-8B-shaped checkpoint (random bf16, ~16.4 GB).

1. builds the HF checkpoint in a scratch directory (slime_ext.dev_engine.random_checkpoint.py: 5 GB
   shards streamed, the Qwen3-8B config.json, random bf16 weights from one 256 MiB pool);
2. times a plain copy of the HF shard bytes (Python read/write loop, 64 MiB buffer), then
   `tools.convert_hf_to_megatron` as a subprocess (interpreter start and imports included); each
   timed phase starts cold (`os.sync()`, then the inputs' cached pages dropped with
   POSIX_FADV_DONTNEED) and ends when its output is fsync'ed, so both read from and write to the
   disk and neither pays for the other's write-back;
3. times a plain copy of the torch_dist data files, then `tools.convert_megatron_to_hf`;
4. checks a sample of tensors (embedding, layer 0 and last layer, lm_head) came back bit-exact,
   and deletes everything it made (scratch peak: ~3 x 16.4 GB on disk).

Conversion speed is reported as the fraction of the copy's bytes/second for the same bytes;
peak RSS is the converter subprocess's ru_maxrss (os.wait4). Goals: >= 50 % of copy speed,
<= 4 GB peak RSS.

  python bench/convert.py --scratch /var/tmp/convert-bench [--layers 36] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slime_ext.convert.hf_io import HFReader  # noqa: E402
from slime_ext.dev_engine.random_checkpoint import write_random_weights  # noqa: E402

QWEN3_8B = json.loads((REPO / "configs" / "models" / "hf_configs" / "qwen3-8B.json").read_text())


def build_hf(out: Path, config: dict, seed: int) -> int:
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return write_random_weights(out, config, seed)


def fsync_tree(root: Path) -> None:
    """Flush what a phase wrote, so its time is the time to disk and the next phase does not pay
    for this one's write-back (fsync works on the inode, whichever process wrote the pages)."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def cold(paths: list[Path]) -> None:
    """Start a phase with its inputs on disk, not in the page cache: flush everything, then drop
    the (now clean) cached pages of these files only (POSIX_FADV_DONTNEED; nothing system-wide)."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def plain_copy(files: list[Path], dst: Path) -> tuple[float, int]:
    dst.mkdir(parents=True)
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    total = 0
    cold(files)
    start = time.perf_counter()
    for f in files:
        with open(f, "rb") as src, open(dst / f.name, "wb") as out:
            while n := src.readinto(buf):
                out.write(view[:n])
                total += n
    fsync_tree(dst)
    elapsed = time.perf_counter() - start
    shutil.rmtree(dst)
    return elapsed, total


def run_tool(argv: list[str], inputs: list[Path], out: Path) -> tuple[float, float]:
    """(seconds to disk, peak RSS in GB) of a converter subprocess reading `inputs`, writing `out`."""
    cold(inputs)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", *argv, "--no-progress"], cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[0]} failed with exit code {os.waitstatus_to_exitcode(status)}")
    fsync_tree(out)
    return time.perf_counter() - start, usage.ru_maxrss * 1024 / 1e9


def spot_check(a: Path, b: Path, names: list[str]) -> None:
    ra, rb = HFReader(a), HFReader(b)
    for n in names:
        if not torch.equal(ra.get(n), rb.get(n)):
            raise SystemExit(f"round trip changed {n}")


def figures(copy_s: float, copied: int, conv_s: float, rss: float) -> dict[str, float]:
    """One direction's figures: a plain copy of the same bytes against the conversion."""
    return {
        "copy_s": round(copy_s, 1),
        "copy_GBps": round(copied / copy_s / 1e9, 3),
        "convert_s": round(conv_s, 1),
        "convert_GBps": round(copied / conv_s / 1e9, 3),
        "fraction_of_copy": round(copy_s / conv_s, 3),
        "peak_rss_GB": round(rss, 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--scratch", type=Path, required=True, help="empty or absent directory on the disk to test"
    )
    p.add_argument("--layers", type=int, default=QWEN3_8B["num_hidden_layers"], help="fewer for a quick try")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    if a.scratch.exists() and any(a.scratch.iterdir()):
        p.error(f"--scratch {a.scratch} is not empty")
    config = {**QWEN3_8B, "num_hidden_layers": a.layers}
    need = 3.3 * 2 * 8.2e9 * a.layers / 36
    a.scratch.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(a.scratch).free
    if free < need:
        p.error(f"{a.scratch}: {free / 1e9:.0f} GB free, the bench needs ~{need / 1e9:.0f} GB")
    hf, mg, back = a.scratch / "hf", a.scratch / "torch_dist", a.scratch / "hf_back"
    result: dict = {
        "machine": f"{platform.node()} {os.cpu_count()} cpus",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "layers": a.layers,
    }
    try:
        t0 = time.perf_counter()
        result["hf_bytes"] = build_hf(hf, config, a.seed)
        result["build_s"] = round(time.perf_counter() - t0, 1)
        print(f"built {result['hf_bytes'] / 1e9:.2f} GB in {result['build_s']} s", flush=True)

        hf_files = sorted(hf.glob("*.safetensors"))
        copy_s, copied = plain_copy(hf_files, a.scratch / "copy1")
        conv_s, rss = run_tool(
            ["tools.convert_hf_to_megatron", "--hf-dir", str(hf), "--out", str(mg)], hf_files, mg
        )
        result["hf_to_megatron"] = figures(copy_s, copied, conv_s, rss)
        print("hf->torch_dist", result["hf_to_megatron"], flush=True)

        data = sorted((mg / "release").glob("__0_*.distcp"))
        copy_s, copied = plain_copy(data, a.scratch / "copy2")
        conv_s, rss = run_tool(
            [
                "tools.convert_megatron_to_hf",
                "--input",
                str(mg),
                "--hf-config-dir",
                str(hf),
                "--out",
                str(back),
            ],
            data,
            back,
        )
        result["megatron_to_hf"] = figures(copy_s, copied, conv_s, rss)
        print("torch_dist->hf", result["megatron_to_hf"], flush=True)
        last = a.layers - 1
        spot_check(
            hf,
            back,
            [
                "model.embed_tokens.weight",
                "lm_head.weight",
                "model.norm.weight",
                *[
                    f"model.layers.{i}.{n}"
                    for i in (0, last)
                    for n in (
                        "self_attn.q_proj.weight",
                        "self_attn.k_proj.weight",
                        "self_attn.v_proj.weight",
                        "mlp.gate_proj.weight",
                        "mlp.up_proj.weight",
                        "self_attn.q_norm.weight",
                    )
                ],
            ],
        )
        with safe_open(sorted(back.glob("*.safetensors"))[0], framework="pt") as f:
            result["hf_back_first_shard_tensors"] = len(list(f.keys()))
        result["spot_check"] = "bit-exact"
    finally:
        shutil.rmtree(a.scratch, ignore_errors=True)
    print(json.dumps(result, indent=2))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
