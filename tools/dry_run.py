"""The CPU dry run: the rollout half of the main job, for real, on a machine without a GPU.

  python -m tools.dry_run                         # embedded CPU engine serving a tiny random model
  python -m tools.dry_run --engine-url http://127.0.0.1:30000   # any SGLang /generate server

What it does, in order:
1. installs what it needs and is missing (`transformers`, `tokenizers`; `--no-install` refuses);
2. builds a tiny Qwen3-architecture model with random weights and a locally trained tokenizer
   (`slime_ext/dev_engine/tiny_model.py`) in RUN_DIR/model;
3. writes prompt records (`slime_ext/rollout/problems.py`) from the bundled sample problems;
4. starts the main job's launcher (`scripts/run_kbench_multiturn.sh`) with the same tmux window
   layout, health-gated: `engine` (the embedded `/generate` engine, `slime_ext/dev_engine/engine.py`;
   absent with --engine-url), `eval` (the eval server in CPU mode), `buffer` (the buffer server
   with its agent runner), `trainer` (instead of slime: `tools/rollout_step.py`, which does what
   slime's rollout function does: start the runner, take one batch of whole groups, ack);
5. prints the per-turn summary (compiled / correct / reward) and where the trajectories and
   logs are, stops the session and every process it started (`scripts/stop.sh`), exits 0.

The model is random, so what it writes is mostly not code: the table shows that honestly.
`--scripted` (labelled SCRIPTED in the output; not a model's answers) makes the embedded engine
answer each problem with its bundled correct candidate (teacher-forced log-probs), so the eval
server path runs deterministically. `--scripted-mix P` (labelled SCRIPTED MIX) answers each turn
with a correct candidate with probability P, else a wrong one (a bundled candidate that is
incorrect or does not compile, or no code), drawn reproducibly per request, so one GRPO group holds
both (slime_ext/dev_engine/scripted.py). Training itself needs the slime Docker image and GPUs
(docs/LAUNCH.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from krl_common.cli import make_parser
from krl_common.shutdown import interrupt_on_termination, interrupted_exit_code

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "scripts" / "run_kbench_multiturn.sh"
STOPPER = REPO / "scripts" / "stop.sh"
RECIPE = REPO / "configs" / "dry_run" / "recipe.yaml"
# What the dry run installs when missing: the range its engine was run with (transformers 4.51
# through 5.24 with tokenizers up to 0.23; the engine passes its KV cache by the name each takes, `past_key_values` or `cache`)
NEEDED = {"transformers": "transformers>=4.51,<5.25", "tokenizers": "tokenizers>=0.21,<0.24"}


class DryRunError(RuntimeError):
    """The dry run cannot go on; the message says what failed and what to do."""


def ensure_requirements(install: bool) -> None:
    """Install the missing Python packages (or say which are missing); tmux and bash are checked."""
    missing = [spec for mod, spec in NEEDED.items() if importlib.util.find_spec(mod) is None]
    if missing:
        if not install:
            raise DryRunError(
                f"missing packages: {' '.join(missing)} (pip install them, or drop --no-install)"
            )
        print(f"installing {' '.join(missing)} ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", *missing], check=True)
        importlib.invalidate_caches()
    for tool, fix in (
        ("tmux", "apt-get install tmux (or your system's package manager)"),
        ("bash", "install bash"),
    ):
        if shutil.which(tool) is None:
            raise DryRunError(f"{tool} not found: {fix}")


def write_prompts(path: Path, names: list[str] | None) -> int:
    """Prompt records from the bundled sample problems (all, or the named ones)."""
    from slime_ext.dev_engine.scripted import sample_prompt_records
    from slime_ext.rollout.problems import write_prompt_records

    try:
        records = sample_prompt_records(names)
    except ValueError as exc:
        raise DryRunError(str(exc)) from None
    return write_prompt_records(path, records)


SCRIPTED_MAX_NEW_TOKENS = 2048  # a bundled candidate plus its fence fits


def write_scripted_rules(path: Path, names: list[str] | None, *, mix: bool = False) -> int:
    """SCRIPTED MODE answers for the embedded engine: a prompt holding a sample problem's source is
    answered with that problem's bundled correct candidate in a python fence; with `mix`, the wrong
    answers that `--scripted-mix` draws from are written too. Returns the number of answers."""
    from slime_ext.dev_engine.scripted import sample_answers, write_answers

    return write_answers(path, sample_answers(names, wrong=mix))


def _scripted_label(mix: float | None, *, after: bool = False) -> str:
    """The line that labels a scripted run in the dry run's output (`after`: above the table)."""
    if mix is None:
        if after:
            return "SCRIPTED run: the answers are the bundled correct candidates, not the model's"
        return "SCRIPTED: the engine answers with the bundled correct candidates, not the model"
    return (
        f"SCRIPTED MIX{' run' if after else ''}: the answers are bundled candidates, not the model's: "
        f"correct with probability {mix:g}, else wrong (incorrect, not compiling, or no code)"
    )


def write_recipe(path: Path, max_new_tokens: int | None) -> Path:
    """The dry run's base recipe, with another per-turn token budget if given (the launcher fills
    in URLs and paths, then validates it)."""
    import yaml

    from krl_common.fileio import atomic_write
    from tools.run_recipe import with_values

    full = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    if max_new_tokens:
        n = max_new_tokens
        sets = [
            f"runner.max_new_tokens={n}",
            f"episode.max_new_tokens_per_turn={n}",
            f"runner.max_context_tokens={4 * n}",
        ]
        full["kernel_rl"] = with_values(full["kernel_rl"], sets)
    atomic_write(path, yaml.safe_dump(full, sort_keys=False))
    return path


def _free_port() -> int:
    from krl_common.service import free_port

    return free_port()


def launch(
    run_dir: Path, args: argparse.Namespace, num_groups: int
) -> tuple[dict[str, str], subprocess.CompletedProcess[str]]:
    """Start the launcher's tmux session; returns its environment and the launcher's result."""
    py = sys.executable
    buffer_port, eval_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    env.update(
        PYTHON=py,
        RUN_NAME=run_dir.name,
        RUN_DIR=str(run_dir),
        TMUX_SESSION=env.get("TMUX_SESSION", run_dir.name),
        RECIPE=str(run_dir / "dry_run_recipe.yaml"),
        PROMPT_DATA=str(run_dir / "prompts.jsonl"),
        TOKENIZER=str(run_dir / "model"),
        N_SAMPLES_PER_PROMPT=str(args.group_size),
        EVAL_DEVICES="cpu",
        EVAL_CPU_WORKERS=str(args.eval_workers),
        EVAL_PORT=str(eval_port),
        BUFFER_PORT=str(buffer_port),
        BUFFER_DROP_ZERO_VARIANCE="0",  # a random model's group rewards are usually all equal
        BUFFER_GROUP_TIMEOUT_S="0",
        HEALTH_TIMEOUT_S=str(int(args.health_timeout_s)),
        ON_EXIT="wait",  # the dry run stops the session itself (or keeps it: --keep)
        TRAINER_CMD=shlex.join(
            [
                py,
                "-m",
                "tools.rollout_step",
                "--buffer-url",
                f"http://127.0.0.1:{buffer_port}",
                "--num-groups",
                str(num_groups),
                "--timeout-s",
                str(int(args.timeout_s)),
                "--trajectories",
                str(run_dir / "trajectories.jsonl"),
                "--summary",
                str(run_dir / "rollout_step.json"),
            ]
        ),
    )
    if args.engine_url:
        env["SGLANG_URL"] = args.engine_url.rstrip("/")
    else:
        engine_port = _free_port()
        env["SGLANG_URL"] = f"http://127.0.0.1:{engine_port}"
        engine = [
            py,
            "-m",
            "slime_ext.dev_engine.engine",
            "--model",
            str(run_dir / "model"),
            "--port",
            str(engine_port),
        ]
        if args.scripted:
            engine += ["--scripted", str(run_dir / "scripted.jsonl")]
        if args.scripted_mix is not None:
            engine += ["--scripted-mix", str(args.scripted_mix)]
        env["ENGINE_CMD"] = shlex.join(engine)
        env["ENGINE_HEALTH_URL"] = f"http://127.0.0.1:{engine_port}/health"
    result = subprocess.run(["bash", str(LAUNCHER)], env=env, cwd=REPO, capture_output=True, text=True)
    return env, result


ENGINE_CHECK_TIMEOUT_S = 5.0


def check_engine(url: str, timeout_s: float = ENGINE_CHECK_TIMEOUT_S) -> None:
    """Fail in seconds when --engine-url does not answer, instead of the runner retrying it
    quietly (only buffer.log would say so) until the rollout step times out. /health first
    (SGLang servers and routers, the tiny engine), else /get_model_info (SGLang servers)."""
    import httpx

    answers: list[str] = []
    for path in ("/health", "/get_model_info"):
        try:
            reply = httpx.get(url + path, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise DryRunError(
                f"--engine-url {url}: no engine answers ({type(exc).__name__}: {exc or 'no reply'}); "
                "start it, or fix --engine-url (or drop it for the embedded CPU engine)"
            ) from None
        if reply.is_success:
            return
        answers.append(f"{path} -> HTTP {reply.status_code}")
    raise DryRunError(
        f"--engine-url {url}: not a healthy /generate server ({', '.join(answers)}); "
        "fix the engine or --engine-url"
    )


def outage_line(runner: dict, warn_s: float, env: dict[str, str]) -> str | None:
    """One console line when the buffer's agent runner has aborted every episode for `warn_s`
    seconds or more (runner.outage in its /stats), naming the failing service; else None."""
    outage = runner.get("outage") or {}
    failing_s = float(outage.get("failing_s") or 0.0)
    if not outage.get("service") or failing_s < warn_s:
        return None
    service = outage["service"]
    name = {
        "engine": f"the engine {env.get('SGLANG_URL', '')}".rstrip(),
        "eval": f"the eval server http://127.0.0.1:{env.get('EVAL_PORT', '?')}",
    }.get(service, "the episodes")
    return (
        f"      WARNING: {name} has been failing for {failing_s:.0f} s "
        f"({outage.get('consecutive_aborts', 0)} aborted episode(s) in a row; last: "
        f"{(runner.get('last_abort_reason') or '')[:200]}); the runner keeps retrying, see logs/buffer.log"
    )


def _runner_stats(buffer_url: str) -> dict | None:
    """The buffer's runner stats, or None while it does not answer (the step reports that)."""
    import httpx

    try:
        return httpx.get(f"{buffer_url}/stats", timeout=5.0).json().get("runner")
    except (httpx.HTTPError, ValueError):
        return None


class RunStopped(Exception):
    """The run was stopped by someone else (scripts/stop.sh) while the dry run waited."""


def wait_for_step(
    run_dir: Path, timeout_s: float, env: dict[str, str] | None = None, outage_warn_s: float = 30.0
) -> dict:
    """Wait until the trainer window's rollout step has exited; its summary, or why it failed.
    Meanwhile, every few seconds, the buffer's runner stats: an engine or eval outage that lasts
    `outage_warn_s` is printed (then once a minute while it lasts), not only logged in buffer.log."""
    summary, rc_file = run_dir / "rollout_step.json", run_dir / "pids" / "trainer.rc"
    deadline = time.monotonic() + timeout_s
    buffer_url = f"http://127.0.0.1:{env['BUFFER_PORT']}" if env and env.get("BUFFER_PORT") else None
    next_poll, last_warned = time.monotonic(), -float("inf")
    while time.monotonic() < deadline:
        now = time.monotonic()
        if buffer_url and env is not None and now >= next_poll:
            next_poll = now + min(5.0, max(0.5, outage_warn_s / 4))
            runner = _runner_stats(buffer_url)
            line = outage_line(runner, outage_warn_s, env) if runner else None
            if line and now - last_warned >= max(60.0, outage_warn_s):
                print(line, flush=True)
                last_warned = now
        if rc_file.exists():
            rc = rc_file.read_text().strip()
            if rc == "0" and summary.exists():
                return json.loads(summary.read_text(encoding="utf-8"))
            if rc.isdigit() and int(rc) > 128:  # ended by a signal: stopped from outside, not failed
                raise RunStopped(
                    f"the run was stopped from outside (the trainer window ended by signal {int(rc) - 128}: "
                    "scripts/stop.sh, or a kill)"
                )
            tail = (run_dir / "logs" / "trainer.log").read_text(errors="replace")[-3000:]
            raise DryRunError(f"the rollout step failed (trainer window exit code {rc}):\n{tail}")
        time.sleep(0.2)
    raise DryRunError(f"no rollout step after {timeout_s:.0f} s; see {run_dir / 'logs'}")


def stop(run_dir: Path, env: dict[str, str]) -> None:
    """scripts/stop.sh for this run; its messages go to RUN_DIR/logs/stop.log."""
    if (run_dir / "run.env").exists():
        (run_dir / "logs").mkdir(exist_ok=True)
        with open(run_dir / "logs" / "stop.log", "ab") as log:
            subprocess.run(["bash", str(STOPPER), str(run_dir)], env=env, cwd=REPO, stdout=log, stderr=log)


def _say(message: str) -> None:
    """A line on stderr that never raises: the reader may be gone (Ctrl-C ended `| tee` too)."""
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.dry_run", __doc__)
    p.add_argument("--engine-url", help="use this SGLang /generate server instead of the embedded CPU engine")
    p.add_argument("--run-dir", type=Path, help="run directory (default: runs/dry-run-<UTC time>)")
    p.add_argument("--problems", nargs="*", help="sample problem names (default: all bundled samples)")
    p.add_argument("--group-size", type=int, default=2, help="episodes per problem (GRPO group)")
    p.add_argument("--num-groups", type=int, help="groups in the rollout step (default: one per problem)")
    p.add_argument("--eval-workers", type=int, default=2, help="CPU eval workers")
    p.add_argument("--timeout-s", type=float, default=900.0, help="limit for the rollout step")
    p.add_argument("--health-timeout-s", type=float, default=300.0, help="limit for each service to start")
    p.add_argument("--no-install", action="store_true", help="do not pip install missing packages")
    p.add_argument(
        "--keep",
        action="store_true",
        help="leave the session (engine, eval server, buffer) running after the step, to attach to "
        "and look around; stop it with scripts/stop.sh RUN_DIR",
    )
    p.add_argument(
        "--outage-warn-s",
        type=float,
        default=30.0,
        help="print a warning when the engine or eval server has failed every episode for this long",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        help=f"tokens per turn (default: the dry-run recipe's; {SCRIPTED_MAX_NEW_TOKENS} with --scripted)",
    )
    p.add_argument(
        "--scripted",
        action="store_true",
        help="SCRIPTED: the embedded engine answers with the bundled correct candidates (not a model)",
    )
    p.add_argument(
        "--scripted-mix",
        type=float,
        metavar="P",
        help="SCRIPTED MIX: the embedded engine answers with a bundled correct candidate with "
        "probability P, else a wrong one (incorrect, not compiling, or no code); implies --scripted",
    )
    args = p.parse_args(argv)
    if args.scripted_mix is not None:
        if not 0.0 <= args.scripted_mix <= 1.0:
            p.error("--scripted-mix P must be in [0, 1]")
        args.scripted = True
    if args.group_size < 1:
        p.error("--group-size must be >= 1")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    if args.scripted and args.engine_url:
        p.error("--scripted/--scripted-mix script the embedded engine: not combined with --engine-url")
    if args.problems:
        # Refused here, before packages are installed or the model is built.
        from slime_ext.dev_engine.scripted import sample_names

        try:
            sample_names(args.problems)
        except ValueError as exc:
            p.error(f"--problems: {exc}")

    # SIGTERM/SIGHUP (kill, a closed terminal) take the Ctrl-C path: scripts/stop.sh of the run.
    interrupt_on_termination()
    t0 = time.monotonic()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_dir = (
        args.run_dir or Path(os.environ.get("RUNS_ROOT", REPO / "runs")) / f"dry-run-{stamp}"
    ).resolve()
    env: dict[str, str] = dict(os.environ)
    try:
        if args.engine_url:
            check_engine(args.engine_url.rstrip("/"))
        ensure_requirements(install=not args.no_install)
        if run_dir.exists() and any(run_dir.iterdir()):
            raise DryRunError(f"{run_dir} exists and is not empty: choose another --run-dir")
        run_dir.mkdir(parents=True, exist_ok=True)
        from transformers.utils import logging as hf_logging

        from slime_ext.dev_engine.tiny_model import write_model_dir

        hf_logging.disable_progress_bar()

        print(
            f"[1/4] tiny model (random weights, local tokenizer) -> {write_model_dir(run_dir / 'model')}",
            flush=True,
        )
        n = write_prompts(run_dir / "prompts.jsonl", args.problems)
        print(f"[2/4] {n} prompt records from the bundled samples -> {run_dir / 'prompts.jsonl'}", flush=True)
        budget = args.max_new_tokens or (SCRIPTED_MAX_NEW_TOKENS if args.scripted else None)
        write_recipe(run_dir / "dry_run_recipe.yaml", budget)
        if args.scripted:
            write_scripted_rules(run_dir / "scripted.jsonl", args.problems, mix=args.scripted_mix is not None)
            print(f"      {_scripted_label(args.scripted_mix)}", flush=True)
        num_groups = args.num_groups or n
        print(
            "[3/4] starting the tmux session (engine, eval, buffer, trainer, status), each health-gated ...",
            flush=True,
        )
        env, started = launch(run_dir, args, num_groups)
        if started.returncode != 0:
            raise DryRunError(f"the launcher failed:\n{started.stderr[-4000:]}")
        print(started.stdout.rstrip(), flush=True)
        print(
            f"[4/4] one rollout step: {num_groups} group(s) of {args.group_size} episode(s) ...", flush=True
        )
        summary = wait_for_step(run_dir, args.timeout_s + 60, env, args.outage_warn_s)
    except DryRunError as exc:
        stop(run_dir, env)
        _say(f"dry run FAILED: {exc}")
        return 1
    except RunStopped as exc:
        stop(run_dir, env)  # whatever is left of it (stop.sh is safe to run twice)
        _say(f"dry run stopped: {exc}")
        return interrupted_exit_code()
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (interrupt_on_termination)
        # Stop first: the terminal's Ctrl-C also ended whatever reads our output (`| tee log`), so
        # a message before the stop would raise BrokenPipeError and leave the session running.
        _say("dry run interrupted: stopping the session and its processes ...")
        stop(run_dir, env)
        _say("stopped.")
        return interrupted_exit_code()
    if not args.keep:
        stop(run_dir, env)

    from tools.rollout_step import format_summary

    print()
    if args.scripted:
        print(_scripted_label(args.scripted_mix, after=True))
    print(format_summary(summary))
    print()
    print(f"trajectories: {run_dir / 'trajectories.jsonl'}")
    print(f"logs:         {run_dir / 'logs'}/ (engine, eval, buffer, trainer, status)")
    print(f"run dir:      {run_dir} (model, prompts, recipe, buffer database)")
    if args.keep:
        from slime_ext.reports.run_status import read_run_env

        recorded = read_run_env(run_dir)  # the server that holds the session, whatever $TMUX says
        session = env.get("TMUX_SESSION", run_dir.name)
        socket = recorded.get("TMUX_SERVER") or env.get("TMUX_SOCKET", "")
        flag = f" -S {socket}" if "/" in socket else f" -L {socket}" if socket else ""
        print(f"dry run done in {time.monotonic() - t0:.0f} s; the session is kept (--keep):")
        print(f"  attach: tmux{flag} attach -t {session}")
        print(f"  stop:   scripts/stop.sh {run_dir}")
    else:
        print(f"dry run done in {time.monotonic() - t0:.0f} s; the session and its processes are stopped.")
    print("Training itself needs the slime Docker image and GPUs: see docs/LAUNCH.md.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
