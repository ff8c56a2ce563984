"""`python -m buffer_server`: start the rollout buffer service (Flask app on waitress).

Examples:
  python -m buffer_server --db runs/exp1/rollout_buffer.sqlite --group-size 8
  python -m buffer_server --db /tmp/b.sqlite --group-size 16 --min-group-size 4 --group-timeout-s 300
  python -m buffer_server --db /tmp/b.sqlite --no-drop-zero-variance --max-staleness -1
  python -m buffer_server --db runs/exp1/rollout_buffer.sqlite --group-size 8 \\
      --recipe configs/recipe/kernelbench_multiturn.yaml --sglang-url http://127.0.0.1:30000 --autostart

With --recipe (or the runner flags) the agent runner is configured: POST /rollout/start starts it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import sys
from pathlib import Path

from buffer_server.runner.agent_runner import AgentRunner, RunnerError
from buffer_server.runner.config import runner_settings
from buffer_server.store.buffer_store import BufferStore
from buffer_server.store.results import StoreError
from buffer_server.store.rules import GroupRules
from krl_common.cli import make_parser
from krl_common.http_json import add_network_args
from krl_common.shutdown import (
    ensure_port_free,
    exit_port_in_use,
    interrupt_on_termination,
    is_address_in_use,
)
from slime_ext.rollout.recipe import load_recipe

log = logging.getLogger("buffer_server")
# On a signal (scripts/stop.sh, a process manager), how long in-flight episodes may still finish:
# stop.sh SIGKILLs what runs after its STOP_TIMEOUT_S (30 s), and a server killed there writes
# nothing more (measured: an episode waiting on a hung engine held the shutdown until the kill).
SHUTDOWN_STOP_S = 10.0


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("buffer_server", __doc__)
    net = add_network_args(p, env_prefix="BUFFER_SERVER", port=8889, max_body_mb=64.0)
    net.add_argument(
        "--threads", type=int, default=16, help="HTTP worker threads (each waiting POST /batches holds one)"
    )
    net.add_argument(
        "--max-wait-s", type=float, default=600.0, help="cap on the timeout_s of a POST /batches request"
    )
    store = p.add_argument_group("storage and group rules")
    store.add_argument(
        "--db",
        default=os.environ.get("BUFFER_SERVER_DB", "rollout_buffer.sqlite"),
        help="SQLite database file; created if missing, resumed if present (default: ./rollout_buffer.sqlite)",
    )
    store.add_argument("--group-size", type=int, default=8, help="records per instance_id that make a group")
    store.add_argument(
        "--min-group-size",
        type=int,
        default=None,
        help="a partial group that times out is handed out with at least this many records, else dropped "
        "(default: min(2, group size))",
    )
    store.add_argument(
        "--group-timeout-s",
        type=float,
        default=600.0,
        help="age (from its first record) after which a partial group is handed out or dropped; 0 = never",
    )
    store.add_argument(
        "--drop-zero-variance",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="drop groups whose rewards are all equal (no GRPO advantage)",
    )
    store.add_argument(
        "--max-staleness",
        type=int,
        default=1,
        help="drop records with policy_version < current - K; negative = never drop",
    )
    store.add_argument(
        "--lease-s",
        type=float,
        default=300.0,
        help="default time a reader has to ack a batch before its groups are handed out again",
    )
    runner = p.add_argument_group(
        "agent runner", "settings of the recipe's kernel_rl.runner section; a flag overrides the recipe"
    )
    runner.add_argument(
        "--recipe",
        default=os.environ.get("BUFFER_SERVER_RECIPE"),
        help="recipe YAML (slime_ext/rollout/recipe.py): its runner, episode and curriculum sections configure the runner",
    )
    runner.add_argument("--prompt-data", help="prompt records jsonl")
    runner.add_argument("--sglang-url", help="SGLang router URL")
    runner.add_argument("--eval-urls", help="eval server URL(s), comma-separated")
    runner.add_argument("--tokenizer", help="HF tokenizer name or directory of the policy")
    runner.add_argument("--concurrency", type=int, help="episodes in flight at most")
    runner.add_argument(
        "--max-ready-groups", type=int, help="backpressure: no new group while this many wait"
    )
    runner.add_argument("--epochs", type=int, help="passes over the prompt data (recipe default 1)")
    runner.add_argument("--shuffle-seed", type=int, help="prompt order seed (recipe default 0)")
    runner.add_argument("--temperature", type=float, help="must equal slime's --rollout-temperature")
    runner.add_argument(
        "--max-context-tokens", type=int, help="prompt + all turns of one episode (recipe default 32768)"
    )
    runner.add_argument("--run-id", help="uid prefix of the runner's records (one per database)")
    runner.add_argument(
        "--autostart",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start the runner with the server",
    )
    store.add_argument(
        "--ingest-workers",
        type=int,
        default=2,
        help="processes that parse and validate POST /trajectories bodies, beside the server's own "
        "(default 2; 0: all in the server process)",
    )
    store.add_argument(
        "--json-cache-mb",
        type=float,
        default=256.0,
        help="memory for the reply JSON of ready records, prepared before a batch read asks for them; 0 = off",
    )
    p.add_argument("--log-level", default="INFO", help="logging level")
    return p


RUNNER_FLAGS = (
    "prompt_data",
    "sglang_url",
    "eval_urls",
    "tokenizer",
    "concurrency",
    "max_ready_groups",
    "epochs",
    "shuffle_seed",
    "temperature",
    "max_context_tokens",
    "run_id",
    "autostart",
)


def _runner(args: argparse.Namespace, store: BufferStore) -> AgentRunner | None:
    """The runner the recipe and the runner flags configure (None: neither does); a bad setting
    exits with one line naming the key."""
    try:
        recipe = load_recipe(args.recipe) if args.recipe else None
        settings = runner_settings(recipe, {k: getattr(args, k) for k in RUNNER_FLAGS})
        if settings is None:
            return None
        return AgentRunner(
            store,
            settings.runner,
            settings.episode,
            group_size=args.group_size,
            curriculum=settings.curriculum,
        )
    except (OSError, ValueError, RunnerError) as exc:  # ValidationError is a ValueError
        raise SystemExit(f"buffer_server: {exc}") from None


def _store_files(db: str) -> list[Path]:
    """What a new store creates beside its database (SQLite's journal files included)."""
    return [Path(db), *(Path(f"{db}{suffix}") for suffix in ("-wal", "-shm", "-journal", ".lock", ".bodies"))]


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        rules = GroupRules(
            group_size=args.group_size,
            min_group_size=args.min_group_size,
            group_timeout_s=args.group_timeout_s if args.group_timeout_s > 0 else None,
            drop_zero_variance=args.drop_zero_variance,
            max_staleness=args.max_staleness if args.max_staleness >= 0 else None,
            lease_s=args.lease_s,
        )
    except ValueError as exc:
        raise SystemExit(f"buffer_server: {exc}") from None
    # A busy port refused before the database is created, and a start that fails after it
    # (a bad recipe, a missing tokenizer) removes the files it created: nothing half-made is left.
    ensure_port_free("buffer_server", args.host, args.port, "pass --port N (launcher: BUFFER_PORT)")
    created = [p for p in _store_files(args.db) if not p.exists()]
    try:
        store = BufferStore(args.db, rules, json_cache_bytes=int(args.json_cache_mb * (1 << 20)))
    except StoreError as exc:
        _remove(created)
        raise SystemExit(f"buffer_server: {exc}") from None

    try:
        runner = _runner(args, store)
    except BaseException:
        store.close()
        _remove(created)
        raise

    from waitress import create_server

    from buffer_server.app import create_app
    from buffer_server.store import ingest
    from slime_ext.trajectory.codec import unpack_request

    pool = ingest.IngestPool(args.ingest_workers) if args.ingest_workers > 0 else None
    if pool is not None:
        pool.warm_up()
    max_body = int(args.max_body_mb * (1 << 20))
    app = create_app(
        store,
        max_body_bytes=max_body,
        max_wait_s=args.max_wait_s,
        info={
            "service": "buffer_server",
            "fast_ingest": ingest.AVAILABLE,
            "ingest_workers": args.ingest_workers,
        },
        runner=runner,
        encode_body=pool.encode_body if pool is not None else ingest.encode_body,
        unpack_packed=pool.unpack_request if pool is not None else unpack_request,
    )
    try:
        server = create_server(
            app,
            host=args.host,
            port=args.port,
            threads=args.threads,
            # Flask answers 413 (JSON) above --max-body-mb; waitress's own plain-text 413 only
            # beyond 4x that, so it never buffers an unbounded body.
            max_request_body_size=4 * max_body,
            # Keep typical request and reply bodies (a few MB) in memory rather than temp files.
            inbuf_overflow=16 << 20,
            outbuf_overflow=64 << 20,
            recv_bytes=1 << 18,
        )
    except OSError as exc:
        if pool is not None:
            pool.close()
        store.close()
        _remove(created)
        if is_address_in_use(exc):
            exit_port_in_use("buffer_server", args.host, args.port, "pass --port N (launcher: BUFFER_PORT)")
        raise
    # waitress sends at most SO_SNDBUF bytes per send() (default 16 kB: ~1900 Python-level sends
    # for a 30 MB batch reply); accepted connections inherit the listener's 4 MB.
    for listener in [server] if hasattr(server, "socket") else list(getattr(server, "map", {}).values()):
        listener.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)

    # SIGTERM/SIGHUP stop the runner, ingest workers and database as Ctrl-C does (the `finally`).
    interrupt_on_termination()
    log.info(
        "buffer_server listening on http://%s:%s, database %s (policy version %d), rules %s",
        args.host,
        server.effective_port,
        store.path,
        store.policy_version,
        rules,
    )
    if runner is not None and runner.config.autostart:
        runner.start()
    try:
        server.run()  # returns on Ctrl-C/SIGTERM/SIGHUP: waitress catches the KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    finally:
        log.info("shutting down")
        server.close()
        if runner is not None:
            # in-flight episodes get SHUTDOWN_STOP_S to finish, then are cancelled; what finished is
            # written (POST /rollout/stop waits the runner's stop_timeout_s instead)
            runner.stop(timeout_s=min(runner.config.stop_timeout_s, SHUTDOWN_STOP_S))
        if pool is not None:
            pool.close()
        store.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
