"""Seeded A/B runs side by side on one machine: every (arm, seed) pair is one launcher run
(scripts/run_kbench_multiturn.sh) with its own GPUs (`CUDA_VISIBLE_DEVICES`), ports, run name,
tmux session and `SEED`, and the arm's settings (launcher variables, e.g. `CREDIT=trloo`).
Prints the plan (one shell line per run) and, with --launch, starts the runs one after another
(each launcher returns once its services answer); then `tools.compare_training` compares the
arms paired by seed (its command is printed too).

  python -m tools.ab_runs --name credit --arm grpo:CREDIT=trajectory --arm trloo:CREDIT=trloo \\
      --seeds 1,2 --gpus 0,1,2,3 [--gpus-per-run 1] [--launch]
  # run i's ports: the launcher's defaults + 100 i (RAY_CLIENT_PORT - 10 i: Ray refuses 10002-19999)

Settings shared by every run (PRESET, HF_CKPT, NUM_ROLLOUT, ...) come from this environment, as
for one launcher call. Both arms of a seed start together, so they meet the same host load.
Exit code 0, 1 when a launch failed (the runs already started keep running: stop each with
scripts/stop.sh RUN_DIR), 2 for a bad plan.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from krl_common.cli import EXIT_USAGE, make_parser
from tools.run_plan import PORTS, gpu_count

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = "scripts/run_kbench_multiturn.sh"
PORT_STEP = 100
RAY_CLIENT_STEP = -10  # below Ray's worker port range (10002-19999), which `ray start` refuses
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SETTING = re.compile(r"^[A-Z][A-Z0-9_]*=.*$", re.DOTALL)


@dataclass(frozen=True)
class PlannedRun:
    arm: str
    seed: int
    env: dict[str, str]  # what this run sets on top of the caller's environment

    @property
    def run_name(self) -> str:
        return self.env["RUN_NAME"]

    def shell_line(self) -> str:
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items()) + f" {LAUNCHER}"


def default_ports(common_sh: Path = REPO / "configs" / "run" / "common.sh") -> dict[str, int]:
    """The launcher's default ports, read from their one definition (`: "${X:=N}"` lines)."""
    text = common_sh.read_text()
    out = {}
    for name in PORTS:
        m = re.search(rf'^: "\$\{{{name}:=(\d+)\}}"', text, re.MULTILINE)
        if m is None:
            raise ValueError(f"{common_sh}: no default for {name}")
        out[name] = int(m.group(1))
    return out


def parse_arm(text: str) -> tuple[str, dict[str, str]]:
    """`NAME:VAR=VALUE[,VAR=VALUE...]` -> (NAME, settings)."""
    name, _, rest = text.partition(":")
    if not _NAME.match(name):
        raise ValueError(f"--arm {text!r}: expected NAME:VAR=VALUE[,VAR=VALUE...] with a plain NAME")
    settings = {}
    for item in filter(None, rest.split(",")):
        if not _SETTING.match(item):
            raise ValueError(f"--arm {text!r}: {item!r} is not VAR=VALUE (an upper-case launcher variable)")
        key, _, value = item.partition("=")
        settings[key] = value
    return name, settings


def plan(
    name: str, arms: list[tuple[str, dict[str, str]]], seeds: list[int], gpus: list[str], gpus_per_run: int,
    ports: dict[str, int] | None = None,
) -> list[PlannedRun]:  # fmt: skip
    """One run per (seed, arm), seed by seed, each on the next `gpus_per_run` of `gpus`."""
    if not _NAME.match(name):
        raise ValueError(f"--name {name!r}: letters, digits, '.', '_' and '-' only")
    if len({a for a, _ in arms}) != len(arms) or not arms:
        raise ValueError("give at least one --arm, each with its own name")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {seeds}: at least one, no repeats")
    if gpus_per_run < 1:
        raise ValueError(f"--gpus-per-run {gpus_per_run}: at least 1")
    needed = len(arms) * len(seeds) * gpus_per_run
    if needed > len(gpus):
        raise ValueError(
            f"{len(arms)} arms x {len(seeds)} seeds x {gpus_per_run} GPU(s) need {needed} GPUs, "
            f"--gpus has {len(gpus)}: fewer seeds, or run the seeds in turns (--seeds 1 now, --seeds 2 after)"
        )
    base = ports or default_ports()
    owned = {"CUDA_VISIBLE_DEVICES", "RUN_NAME", "TMUX_SESSION", "SEED", *PORTS}
    runs = []
    for seed in seeds:
        for arm, settings in arms:
            clash = sorted(owned & settings.keys())
            if clash:
                raise ValueError(f"arm {arm}: {', '.join(clash)} are set by the plan, not by an arm")
            i = len(runs)
            run_name = f"{name}-{arm}-s{seed}"
            env = {
                "CUDA_VISIBLE_DEVICES": ",".join(gpus[i * gpus_per_run : (i + 1) * gpus_per_run]),
                "RUN_NAME": run_name,
                "TMUX_SESSION": run_name,
                "SEED": str(seed),
            }
            for port in PORTS:
                env[port] = str(
                    base[port] + i * (RAY_CLIENT_STEP if port == "RAY_CLIENT_PORT" else PORT_STEP)
                )
            runs.append(PlannedRun(arm, seed, {**env, **settings}))
    return runs


def compare_command(runs: list[PlannedRun], runs_root: str) -> str | None:
    """tools.compare_training over the first two arms, paired by seed (None with one arm)."""
    arms = list(dict.fromkeys(r.arm for r in runs))
    if len(arms) < 2:
        return None
    a, b = arms[:2]

    def dirs(arm: str) -> str:
        return ",".join(f"{runs_root}/{r.run_name}" for r in runs if r.arm == arm)

    return f"python -m tools.compare_training --a {dirs(a)} --b {dirs(b)} --labels {a},{b}"


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.ab_runs", __doc__)
    p.add_argument("--name", required=True, help="prefix of every run's RUN_NAME")
    p.add_argument(
        "--arm", action="append", default=[], help="NAME:VAR=VALUE[,VAR=VALUE...] (repeat per arm)"
    )
    p.add_argument("--seeds", default="1,2", help="comma-separated integers (default 1,2)")
    p.add_argument(
        "--gpus", default=os.environ.get("CUDA_VISIBLE_DEVICES", ""), help="GPU indices to share out"
    )
    p.add_argument("--gpus-per-run", type=int, default=1, help="GPUs of each run (its CUDA_VISIBLE_DEVICES)")
    p.add_argument("--launch", action="store_true", help="start the runs (default: print the plan only)")
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
        if not gpus:
            gpus = [str(i) for i in range(gpu_count())]
        runs = plan(args.name, [parse_arm(a) for a in args.arm], seeds, gpus, args.gpus_per_run)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    runs_root = os.environ.get("RUNS_ROOT", str(REPO / "runs"))  # the launcher's default
    for run in runs:
        print(run.shell_line())
    compare = compare_command(runs, runs_root)
    if not args.launch:
        if compare:
            print(f"# when they are done:\n{compare}")
        return 0
    for run in runs:
        print(f"starting {run.run_name} ...", flush=True)
        done = subprocess.run(["bash", str(REPO / LAUNCHER)], env={**os.environ, **run.env}, cwd=REPO)
        if done.returncode != 0:
            started = [r.run_name for r in runs[: runs.index(run)]]
            print(
                f"error: {run.run_name} did not start (exit {done.returncode}); "
                + (
                    f"still running: {', '.join(started)} (scripts/stop.sh {runs_root}/NAME)"
                    if started
                    else "none started"
                ),
                file=sys.stderr,
            )
            return 1
    if compare:
        print(f"started {len(runs)} runs; when they are done:\n{compare}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
