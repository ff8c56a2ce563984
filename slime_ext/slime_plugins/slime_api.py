"""The only place that imports slime (lazily, inside functions), so that every module of this
package imports without slime installed; slime is only present inside its Docker image / Ray
workers. Names follow THUDM/slime @ 624b824a (see /work/shared/slime_interfaces.md)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "abort_engines_until_idle",
    "eval_output",
    "log_metrics",
    "rollout_step",
    "sample_class",
    "slime_router_url",
    "train_output",
]


def sample_class() -> Any:
    """`slime.utils.types.Sample`."""
    from slime.utils.types import Sample

    return Sample


def train_output(samples: list[Any], metrics: dict[str, Any] | None) -> Any:
    """`RolloutFnTrainOutput(samples, metrics)`."""
    from slime.rollout.base_types import RolloutFnTrainOutput

    return RolloutFnTrainOutput(samples=samples, metrics=metrics)


def eval_output(data: dict[str, dict[str, Any]], metrics: dict[str, Any] | None) -> Any:
    """`RolloutFnEvalOutput(data, metrics)`."""
    from slime.rollout.base_types import RolloutFnEvalOutput

    return RolloutFnEvalOutput(data=data, metrics=metrics)


def rollout_step(args: Any, rollout_id: int) -> int:
    """The logging step slime uses for a rollout (`compute_rollout_step`)."""
    from slime.observability.metric_utils import compute_rollout_step

    return int(compute_rollout_step(args, rollout_id))


def log_metrics(args: Any, metrics: dict[str, Any], step_key: str) -> None:
    """slime's W&B / TensorBoard logging call (`logging_utils.log`)."""
    from slime.observability import logging_utils

    logging_utils.log(args, metrics, step_key=step_key)


def slime_router_url(args: Any) -> str:
    """slime's own SGLang router (the one its engines register with; not plugins.sglang_url)."""
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


def abort_engines_until_idle(args: Any, timeout_s: float = 120.0) -> None:
    """What slime does after its own rollouts (`sglang_rollout.abort`): `/abort_request` with
    `abort_all` to every SGLang worker behind its router, until their loads report no request
    (`server_control.abort_servers_until_idle`). slime offloads colocated engines next, and SGLang's
    `release_memory_occupation` asserts an idle server. slime's loop retries without end; past
    `timeout_s` this raises instead (a step that fails says why; a hung one does not)."""
    import asyncio

    from slime.backends.sglang_utils.server_control import abort_servers_until_idle
    from slime.utils.async_utils import run
    from slime.utils.http_utils import get

    router = slime_router_url(args)
    urls: list[str] = []

    async def abort() -> None:
        workers = await get(f"{router}/workers")
        urls.extend(w["url"] for w in workers["workers"])
        await asyncio.wait_for(abort_servers_until_idle(urls), timeout_s)

    try:
        run(abort())
    except TimeoutError:
        raise RuntimeError(
            f"SGLang workers {urls} behind {router} still had requests {timeout_s:g} s after "
            "/abort_request: slime cannot release their memory for training"
        ) from None
