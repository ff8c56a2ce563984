"""The trainer's controls: POST /policy_version moves the policy version forward (dropping
stale records), POST /rollout/start and /rollout/stop drive the agent runner.

Separate from the batch hand-out: these change what the buffer produces, not what it hands out.
"""

from __future__ import annotations

from flask import Response, jsonify

from buffer_server.api.bodies import empty_body, json_fields
from buffer_server.api.context import ApiContext
from krl_common.validation import check_int_range

__all__ = ["NO_RUNNER", "policy_version", "rollout_start", "rollout_stop"]

NO_RUNNER = (
    "no agent runner is configured: start the buffer server with --recipe PATH (a recipe YAML with a "
    "kernel_rl.runner section) or the runner flags (--prompt-data, --sglang-url, --eval-urls, --tokenizer); "
    "without it, write trajectories with POST /trajectories"
)


def policy_version(ctx: ApiContext) -> tuple[Response, int]:
    """Move the policy version forward; the reply counts the records dropped as stale."""
    body = json_fields('like {"version": 3}', {"version"}, required=("version",))
    version = check_int_range("version", body["version"], 0, 2**62)
    dropped = ctx.store.set_policy_version(version)
    return jsonify(policy_version=ctx.store.policy_version, dropped_stale=dropped), 200


def rollout_start(ctx: ApiContext) -> tuple[Response, int]:
    """Start the agent runner (409 when none is configured)."""
    empty_body("(empty: {})")
    if ctx.runner is None:
        return jsonify(error=NO_RUNNER), 409
    started = ctx.runner.start()
    return jsonify(running=True, started=started), 200


def rollout_stop(ctx: ApiContext) -> tuple[Response, int]:
    """Stop the agent runner; without one, say so (not an error: there is nothing to stop)."""
    empty_body("(empty: {})")
    if ctx.runner is None:
        return jsonify(running=False, configured=False), 200
    ctx.runner.stop()
    return jsonify(running=ctx.runner.running), 200
