"""What an episode needs inside slime's rollout actor: tokenizer, SGLang and eval clients, the
problem lookup, and the episode call itself (shared by custom generate and the eval path).

Rules from slime_interfaces.md: rollout-side hooks run in one asyncio loop (no GPU), so clients
are async and created once per event loop (an httpx client belongs to the loop it was made in);
the tokenizer is loaded once per path, off the loop. Sampling follows slime's own generate: the
router URL `http://{sglang_router_ip}:{sglang_router_port}`, temperature = the rollout (or eval)
temperature, top_k / stop / stop_token_ids from args. top_p != 1 is refused: slime then needs
top-p replay data that this token-in/token-out client does not return.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eval_server.schema import problem_hash
from slime_ext.clients.eval_client import EvalClient
from slime_ext.clients.sglang_client import SGLangClient
from slime_ext.rollout.chat import ChatRenderer
from slime_ext.rollout.episode import Episode, EpisodeConfig, run_episode
from slime_ext.rollout.problems import PromptRecord, load_prompt_records
from slime_ext.slime_plugins.config import PluginConfig

__all__ = [
    "EpisodeResources",
    "get_resources",
    "load_tokenizer",
    "max_context_len",
    "problem_index",
    "router_url",
    "run_problem",
    "sampling_extras",
]

_lock = threading.Lock()
_tokenizers: dict[str, Any] = {}
_indexes: dict[str, dict[str, PromptRecord]] = {}


def load_tokenizer(path: str) -> Any:
    """The HF tokenizer at `path` (a directory or hub name), loaded once per process."""
    with _lock:
        if path not in _tokenizers:
            from transformers import AutoTokenizer

            _tokenizers[path] = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        return _tokenizers[path]


def problem_index(path: str) -> dict[str, PromptRecord]:
    """Prompt records of a jsonl file keyed by problem hash (sha256 of the reference source)."""
    with _lock:
        if path not in _indexes:
            _indexes[path] = {r.problem_hash: r for r in load_prompt_records(path)}
        return _indexes[path]


def router_url(args: Any, cfg: PluginConfig) -> str:
    if cfg.sglang_url:
        return cfg.sglang_url
    ip, port = getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)
    if not ip or not port:
        raise ValueError(
            "no SGLang router: args.sglang_router_ip/port unset and kernel_rl.plugins.sglang_url unset"
        )
    return f"http://{ip}:{port}"


def max_context_len(args: Any, cfg: PluginConfig, *, evaluation: bool = False) -> int:
    value = cfg.max_context_tokens
    if value is None and evaluation:
        value = getattr(args, "eval_max_context_len", None)
    if value is None:
        value = getattr(args, "rollout_max_context_len", None)
    if value is None:
        raise ValueError(
            "no context budget for multi-turn episodes: set --rollout-max-context-len or "
            "kernel_rl.plugins.max_context_tokens"
        )
    return int(value)


def sampling_extras(args: Any) -> dict[str, Any]:
    """Sampling params besides temperature / max_new_tokens, as slime's GenerateState builds them."""
    top_p = getattr(args, "rollout_top_p", 1.0)
    if top_p is not None and float(top_p) != 1.0:
        raise ValueError(
            f"--rollout-top-p {top_p} is not supported by the kernel_rl plug-ins: slime then requires "
            "top-p replay data per token, which token-in/token-out generation does not return; use 1.0"
        )
    extras: dict[str, Any] = {}
    top_k = getattr(args, "rollout_top_k", -1)
    if top_k is not None and top_k != -1:
        extras["top_k"] = int(top_k)
    for key, arg in (("stop", "rollout_stop"), ("stop_token_ids", "rollout_stop_token_ids")):
        value = getattr(args, arg, None)
        if value:
            extras[key] = value
    return extras


@dataclass
class EpisodeResources:
    """Clients bound to one event loop, plus the tokenizer and renderer they serve."""

    sglang: SGLangClient
    evaluator: EvalClient
    tokenizer: Any
    renderer: ChatRenderer

    async def aclose(self) -> None:
        await self.sglang.aclose()
        await self.evaluator.aclose()


# event loop -> {settings key -> resources}; entries go away with their loop
_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], EpisodeResources]] = (
    weakref.WeakKeyDictionary()
)


async def get_resources(
    args: Any, cfg: PluginConfig, episode: EpisodeConfig, *, temperature: float, evaluation: bool = False
) -> EpisodeResources:
    """The resources for these settings in the running loop (created on first use)."""
    url = router_url(args, cfg)
    context = max_context_len(args, cfg, evaluation=evaluation)
    extras = sampling_extras(args)
    tok_path = cfg.tokenizer or getattr(args, "hf_checkpoint", None)
    if not tok_path:
        raise ValueError("no tokenizer: args.hf_checkpoint unset and kernel_rl.plugins.tokenizer unset")
    key = (
        url,
        float(temperature),
        context,
        repr(sorted(extras.items())),
        tok_path,
        tuple(cfg.resolved_eval_urls),
        episode.enable_thinking,
        episode.end_of_turn,
        repr(episode.chat_template_kwargs),
    )
    cache = _per_loop.setdefault(asyncio.get_running_loop(), {})
    if key not in cache:
        tokenizer = await asyncio.to_thread(load_tokenizer, tok_path)
        renderer = ChatRenderer(
            tokenizer,
            enable_thinking=episode.enable_thinking,
            end_of_turn=episode.end_of_turn,
            chat_template_kwargs=episode.chat_template_kwargs,
        )
        cache[key] = EpisodeResources(
            sglang=SGLangClient(
                url, temperature=temperature, max_context_len=context, sampling_params=extras
            ),
            evaluator=EvalClient(cfg.resolved_eval_urls, timeout_s=cfg.eval_timeout_s),
            tokenizer=tokenizer,
            renderer=renderer,
        )
    return cache[key]


def problem_info(
    reference: str, cfg: PluginConfig, label: Any = None, metadata: Mapping[str, Any] | None = None
):
    """(problem for run_episode, info for the Sample metadata) of a reference source."""
    digest = problem_hash(reference)
    record = problem_index(cfg.prompt_data).get(digest) if cfg.prompt_data else None
    metadata = metadata or {}
    if record is not None:
        return record, {
            "instance_id": record.instance_id,
            "level": record.level,
            "problem_id": record.problem_id,
        }
    instance_id = label if isinstance(label, str) and label else metadata.get("instance_id") or digest[:16]
    return (
        {"reference": reference, "problem_id": metadata.get("problem_id") or instance_id},
        {
            "instance_id": instance_id,
            "level": metadata.get("level"),
            "problem_id": metadata.get("problem_id"),
        },
    )


async def run_problem(
    problem: Any,
    res: EpisodeResources,
    episode: EpisodeConfig,
    *,
    max_new_tokens: int | None,
    headers: Mapping[str, str] | None = None,
) -> Episode:
    """run_episode with these resources; `max_new_tokens` is the per-turn cap unless the episode
    config sets its own (`max_new_tokens_per_turn`)."""
    if episode.max_new_tokens_per_turn is None and max_new_tokens is not None:
        episode = dataclasses.replace(episode, max_new_tokens_per_turn=int(max_new_tokens))
    return await run_episode(
        problem,
        tokenizer=res.tokenizer,
        sglang=res.sglang,
        evaluator=res.evaluator,
        config=episode,
        renderer=res.renderer,
        request_headers=headers,
    )
