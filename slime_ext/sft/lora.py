"""LoRA / QLoRA supervised fine-tuning of an HF causal LM on our SFT jsonl, for one GPU (or the
CPU, for tests): transformers + PEFT, a plain loop (one conversation per micro-batch, per-token
loss over each accumulation step like slime's `--calculate-per-token-loss`), eval loss on a
held-out split, checkpoints that resume, and a merged HF checkpoint at the end that our
converters and SGLang read as is (the adapter alone with `adapter_only`).

Layout of `out`: `checkpoints/step-N/` (adapter, optimizer, trainer state; the newest two kept),
`adapter/` (the final adapter), `merged/` (base + adapter, unless adapter_only), `log.jsonl`
(one line per logged step and eval), `summary.json`.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slime_ext.data.sft_format import load_sft_jsonl
from slime_ext.sft.masking import tokenize_conversation

__all__ = ["LoraSFTConfig", "Tokenized", "prepare_data", "train"]

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KEEP_CHECKPOINTS = 2


@dataclass
class LoraSFTConfig:
    model: str  # HF directory of the base model
    data: str  # SFT jsonl (slime_ext/data/sft_format.py)
    out: str
    eval_data: str | None = None  # held-out SFT jsonl; else eval_share of `data`
    eval_share: float = 0.05
    epochs: float = 1.0
    max_steps: int | None = None  # optimizer steps; overrides epochs
    lr: float = 2e-4
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_accum: int = 8  # conversations per optimizer step
    max_len: int = 8192  # longer conversations are skipped (counted)
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    qlora: bool = False  # 4-bit base (bitsandbytes, CUDA)
    dtype: str = "bfloat16"  # base weights (LoRA) and the merged output
    log_every: int = 10
    eval_every: int = 100
    save_every: int = 100
    seed: int = 0
    adapter_only: bool = False
    device: str | None = None  # default: cuda if available, else cpu

    def __post_init__(self) -> None:
        if self.grad_accum < 1 or self.max_len < 2 or self.lr <= 0:
            raise ValueError("need grad_accum >= 1, max_len >= 2 and lr > 0")
        if not 0 <= self.eval_share < 1:
            raise ValueError(f"eval_share must be in [0, 1), got {self.eval_share}")
        if self.max_steps is None and self.epochs <= 0:
            raise ValueError("need epochs > 0 or max_steps")


@dataclass(frozen=True)
class Tokenized:
    ids: list[int]
    mask: list[int]


def prepare_data(
    cfg: LoraSFTConfig, tokenizer: Any
) -> tuple[list[Tokenized], list[Tokenized], dict[str, int]]:
    """(train, eval, counts): the conversations tokenized with their loss masks; those over
    max_len or without a trained token skipped and counted; eval from eval_data or a seeded share."""

    def load(path: str) -> tuple[list[Tokenized], int]:
        kept, skipped = [], 0
        for example in load_sft_jsonl(path):
            ids, mask = tokenize_conversation(tokenizer, example.messages)
            if len(ids) > cfg.max_len or not any(mask):
                skipped += 1
                continue
            kept.append(Tokenized(ids, mask))
        return kept, skipped

    train, skipped = load(cfg.data)
    if cfg.eval_data:
        held, skipped_eval = load(cfg.eval_data)
    else:
        order = list(range(len(train)))
        random.Random(cfg.seed).shuffle(order)
        n_eval = min(len(train) - 1, max(1, round(cfg.eval_share * len(train)))) if cfg.eval_share > 0 else 0
        held = [train[i] for i in sorted(order[:n_eval])]
        train = [train[i] for i in sorted(order[n_eval:])]
        skipped_eval = 0
    if not train:
        raise ValueError(
            f"{cfg.data}: no conversation to train on (all over max_len {cfg.max_len} or untrained)"
        )
    return train, held, {"train": len(train), "eval": len(held), "skipped": skipped + skipped_eval}


def _device(cfg: LoraSFTConfig) -> Any:
    import torch

    return torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _load_base(cfg: LoraSFTConfig, device: Any, quantized: bool) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, cfg.dtype)
    if not quantized:
        return AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype).to(device)
    if device.type != "cuda":
        raise RuntimeError("QLoRA (4-bit base weights) needs a CUDA GPU and bitsandbytes")
    try:
        from transformers import BitsAndBytesConfig
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(f"QLoRA needs transformers with bitsandbytes support ({exc})") from exc
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_use_double_quant=True,
    )
    return AutoModelForCausalLM.from_pretrained(
        cfg.model, quantization_config=quant, dtype=dtype, device_map={"": device.index or 0}
    )


def _peft_model(cfg: LoraSFTConfig, base: Any) -> Any:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if "lm_head" in cfg.target_modules and getattr(base.config, "tie_word_embeddings", False):
        raise ValueError(
            "lm_head is tied to the input embedding in this model: a LoRA on it cannot be merged "
            "(the merge would change the embedding too); leave it out of --target-modules"
        )
    if cfg.qlora:
        base = prepare_model_for_kbit_training(base)
    lora = LoraConfig(
        task_type="CAUSAL_LM", r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.target_modules),
    )  # fmt: skip
    return get_peft_model(base, lora)


def _token_loss_sum(model: Any, item: Tokenized, device: Any) -> tuple[Any, int]:
    """Summed cross-entropy over the trained tokens of one conversation, and their count."""
    import torch

    ids = torch.tensor([item.ids], device=device)
    logits = model(input_ids=ids).logits[0, :-1].float()
    target = ids[0, 1:]
    weight = torch.tensor(item.mask[1:], device=device, dtype=torch.float32)
    losses = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    return (losses * weight).sum(), int(weight.sum().item())


def _eval_loss(model: Any, held: list[Tokenized], device: Any) -> float | None:
    import torch

    if not held:
        return None
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for item in held:
            s, n = _token_loss_sum(model, item, device)
            total, tokens = total + float(s), tokens + n
    model.train()
    return total / max(tokens, 1)


def _checkpoints(root: Path) -> list[Path]:
    """root's step-N folders, oldest first."""
    return sorted(root.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))


def _latest_checkpoint(out: Path) -> Path | None:
    done = [p for p in _checkpoints(out / "checkpoints") if (p / "trainer_state.json").exists()]
    return done[-1] if done else None


def _save_checkpoint(out: Path, model: Any, optimizer: Any, state: dict[str, Any]) -> Path:
    """step-N written under a temporary name and renamed when complete: a checkpoint that exists
    is whole; the oldest beyond KEEP_CHECKPOINTS are removed."""
    import torch

    root = out / "checkpoints"
    final = root / f"step-{state['step']}"
    tmp = root / f".tmp-step-{state['step']}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "adapter")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(state))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in _checkpoints(root)[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _lr_at(cfg: LoraSFTConfig, step: int, total: int) -> float:
    """Linear warm-up, then cosine decay to 10 % of lr."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(cfg: LoraSFTConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train (resuming from the newest checkpoint in cfg.out), then write the adapter and, unless
    adapter_only, the merged model. Returns the summary (also written to out/summary.json)."""
    import torch
    from peft import PeftModel, set_peft_model_state_dict
    from peft.utils import load_peft_weights
    from transformers import AutoTokenizer

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = _device(cfg)
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    train_set, held, counts = prepare_data(cfg, tokenizer)
    log(f"data: {counts['train']} train, {counts['eval']} eval conversations ({counts['skipped']} skipped)")
    per_epoch = math.ceil(len(train_set) / cfg.grad_accum)
    total = cfg.max_steps if cfg.max_steps is not None else max(1, math.ceil(cfg.epochs * per_epoch))

    model = _peft_model(cfg, _load_base(cfg, device, cfg.qlora))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    trainable = sum(p.numel() for p in params)
    log(
        f"model: {cfg.model}, {trainable} trainable parameters (LoRA r={cfg.lora_r}{', 4-bit base' if cfg.qlora else ''}) on {device}"
    )

    step, cursor = 0, 0  # optimizer steps done; conversations consumed (over epochs)
    resumed = _latest_checkpoint(out)
    if resumed is not None:
        state = json.loads((resumed / "trainer_state.json").read_text())
        set_peft_model_state_dict(model, load_peft_weights(str(resumed / "adapter"), device=str(device)))
        optimizer.load_state_dict(torch.load(resumed / "optimizer.pt", map_location=device))
        step, cursor = int(state["step"]), int(state["cursor"])
        log(f"resumed from {resumed} (step {step})")

    orders: dict[int, list[int]] = {}

    def order_for(epoch: int) -> list[int]:
        """Each epoch's seeded order of the training conversations (the same after a resume)."""
        if epoch not in orders:
            orders.clear()
            orders[epoch] = list(range(len(train_set)))
            random.Random(f"{cfg.seed}:{epoch}").shuffle(orders[epoch])
        return orders[epoch]

    logf = (out / "log.jsonl").open("a")
    eval_loss = None
    t0, tokens_seen = time.monotonic(), 0
    while step < total:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(cfg, step, total)
        optimizer.zero_grad(set_to_none=True)
        batch = []
        for _ in range(cfg.grad_accum):
            epoch, pos = divmod(cursor, len(train_set))
            batch.append(train_set[order_for(epoch)[pos]])
            cursor += 1
        n_tokens = sum(sum(item.mask[1:]) for item in batch)
        loss_total = 0.0
        for item in batch:
            s, _ = _token_loss_sum(model, item, device)
            (s / max(n_tokens, 1)).backward()
            loss_total += float(s.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        tokens_seen += sum(len(item.ids) for item in batch)
        loss = loss_total / max(n_tokens, 1)
        record: dict[str, Any] = {"step": step, "loss": round(loss, 6), "lr": optimizer.param_groups[0]["lr"]}
        if step % cfg.eval_every == 0 or step == total:
            eval_loss = _eval_loss(model, held, device)
            record["eval_loss"] = None if eval_loss is None else round(eval_loss, 6)
        if step % cfg.log_every == 0 or step == total or "eval_loss" in record:
            rate = tokens_seen / max(time.monotonic() - t0, 1e-9)
            log(
                f"step {step}/{total} loss {loss:.4f}"
                + (f" eval_loss {eval_loss:.4f}" if "eval_loss" in record and eval_loss is not None else "")
                + f" ({rate:.0f} tokens/s)"
            )
            logf.write(json.dumps(record) + "\n")
            logf.flush()
        if step % cfg.save_every == 0 or step == total:
            _save_checkpoint(out, model, optimizer, {"step": step, "cursor": cursor, "total": total})
    logf.close()
    if eval_loss is None:  # resumed at the last step
        eval_loss = _eval_loss(model, held, device)

    adapter_dir = out / "adapter"
    shutil.rmtree(adapter_dir, ignore_errors=True)
    model.save_pretrained(adapter_dir)
    tokenizer.save_pretrained(adapter_dir)
    merged_dir = None
    if not cfg.adapter_only:
        # the adapter onto a fresh full-precision base (a 4-bit base cannot be merged exactly)
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the trained copy's memory, before the full-precision base loads
        merged = PeftModel.from_pretrained(
            _load_base(cfg, device, quantized=False), adapter_dir
        ).merge_and_unload()
        merged_dir = out / "merged"
        shutil.rmtree(merged_dir, ignore_errors=True)
        merged.save_pretrained(merged_dir)
        tokenizer.save_pretrained(merged_dir)
    summary = {
        "steps": step,
        "resumed_from": None if resumed is None else resumed.name,
        "final_eval_loss": eval_loss,
        "data": counts,
        "trainable_parameters": trainable,
        "adapter": str(adapter_dir),
        "merged": None if merged_dir is None else str(merged_dir),
        "config": asdict(cfg),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary
