"""A run's plan, decided once: which GPUs train, which generate, which evaluate, and where the
services are (the URLs the agent runner and the plug-ins use, the ports a start needs free).

The launchers (`scripts/run_kbench_multiturn.sh`, `scripts/run_sft.sh`) `eval` what `--shell`
prints, and `tools/preflight.py` checks the same plan, so the rule that turns TRAIN_GPUS,
ROLLOUT_GPUS, EVAL_GPUS, COLOCATE, TRAIN_ONLY, EVAL_DEVICES and the visible GPUs into device
lists, and the one that turns ROUTER_HOST/ROUTER_PORT, ENGINE and SGLANG_URL into the URL every
episode generates with, exist here only. The launcher records the plan in RUN_DIR/run.env, which
scripts/stop.sh and the status window read.

  python -m tools.run_plan --shell            # KEY=VALUE lines for the launcher (env in, env out)
  python -m tools.run_plan --kind sft --shell
  python -m tools.run_plan                    # the plan in words

Visible GPUs: CUDA_VISIBLE_DEVICES's ids when it is set (a run on GPUs 4-7, two runs side by
side), else 0..N-1 with N from NUM_GPUS or nvidia-smi. With PRINT_ONLY=1 and neither set, a
machine with fewer GPUs than the split is not refused: the split is printed as assumed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from krl_common.cli import make_parser

KINDS = ("rl", "sft")


class PlanError(ValueError):
    """The settings cannot make a split; the message names the setting to change."""


@dataclass(frozen=True)
class GpuPlan:
    """Where each role runs. Device lists are physical ids, comma-separated ("" for none)."""

    kind: str
    train: int
    rollout: int  # SGLang engines' GPUs (= train when colocated, 0 with TRAIN_ONLY)
    eval: int
    colocate: bool
    ray_num_gpus: int  # what Ray is started with: training (+ rollout unless colocated)
    need: int  # GPUs this machine must show
    visible: int
    ray_devices: str
    eval_devices: str
    assumed: bool  # PRINT_ONLY on a smaller machine: the split is printed, not checked

    def describe(self) -> str:
        roles = [f"train {self.train}"]
        if self.kind == "rl":
            roles.append("rollout colocated" if self.colocate else f"rollout {self.rollout}")
            roles.append(f"eval {self.eval} ({self.eval_devices or 'none'})")
        return f"{', '.join(roles)}: {self.need} of {self.visible} GPU(s)" + (
            " (assumed)" if self.assumed else ""
        )

    def shell(self) -> dict[str, str]:
        """What the launcher's bash reads back."""
        out = {"RAY_NUM_GPUS": str(self.ray_num_gpus), "RAY_VISIBLE_DEVICES": self.ray_devices}
        if self.kind == "rl":
            out |= {"ROLLOUT_GPUS": str(self.rollout), "EVAL_DEVICES": self.eval_devices}
        return out


def _int(settings: Mapping[str, str], name: str, default: str) -> int:
    raw = settings.get(name) or default
    if not (raw.isascii() and raw.isdigit()):
        raise PlanError(f"{name}={raw}: must be a non-negative integer")
    return int(raw)


def visible_ids(env: Mapping[str, str]) -> list[int]:
    """The GPUs a run may use: CUDA_VISIBLE_DEVICES's ids when set, else 0..N-1 (N: NUM_GPUS, or
    what nvidia-smi lists)."""
    if "CUDA_VISIBLE_DEVICES" in env:
        raw = env["CUDA_VISIBLE_DEVICES"]
        ids = [p for p in raw.split(",") if p != ""]
        if not all(p.isdigit() for p in ids):
            raise PlanError(
                f"CUDA_VISIBLE_DEVICES={raw}: list GPU indices (e.g. 4,5,6,7); the launcher does not take UUIDs"
            )
        return [int(p) for p in ids]
    return list(range(_int(env, "NUM_GPUS", "0") if env.get("NUM_GPUS") else gpu_count()))


def gpu_count() -> int:
    """GPUs nvidia-smi lists (0 without it)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU") for line in out.stdout.splitlines())


def _ids(ids: Sequence[int], start: int, count: int) -> str:
    """Entries start..start+count-1; a position past the list is its own index (an assumed split)."""
    return ",".join(str(ids[i]) if i < len(ids) else str(i) for i in range(start, start + count))


def plan_gpus(settings: Mapping[str, str], ids: Sequence[int], kind: str = "rl") -> GpuPlan:
    """The split for `settings` (the launcher's environment) on the GPUs `ids`."""
    if kind not in KINDS:
        raise PlanError(f"kind must be one of {KINDS}, got {kind!r}")
    train = _int(settings, "TRAIN_GPUS", "4")
    tp, cp, pp = (_int(settings, n, "1") for n in ("TP", "CP", "PP"))
    if tp * cp * pp == 0 or train % (tp * cp * pp):
        raise PlanError(f"TRAIN_GPUS={train} is not a multiple of TP*CP*PP={tp * cp * pp}")
    trainer_replaced = bool(settings.get("TRAINER_CMD"))
    if kind == "sft":
        rollout = ev = 0
        colocate = False
        ray = train
    else:
        rollout = _int(settings, "ROLLOUT_GPUS", "2")
        ev = _int(settings, "EVAL_GPUS", "2")
        per_engine = _int(settings, "ROLLOUT_GPUS_PER_ENGINE", "1")
        colocate = settings.get("COLOCATE") == "1"
        if settings.get("TRAIN_ONLY") == "1":
            rollout = 0  # no SGLang engine
        if colocate:
            rollout = train
            ray = train
        else:
            if per_engine == 0 or rollout % per_engine:
                raise PlanError(
                    f"ROLLOUT_GPUS={rollout} is not a multiple of ROLLOUT_GPUS_PER_ENGINE={per_engine}"
                )
            ray = train + rollout
    # GPUs needed: Ray's (none when TRAINER_CMD replaces the trainer: tests, the dry run), plus
    # the eval server's unless EVAL_DEVICES names its devices (cpu, or GPUs shared with training)
    eval_named = settings.get("EVAL_DEVICES", "")
    need = 0 if trainer_replaced else ray
    if kind == "rl" and not eval_named:
        need = ray + ev
    assumed = False
    if len(ids) < need:
        if (
            settings.get("PRINT_ONLY") == "1"
            and not settings.get("NUM_GPUS")
            and "CUDA_VISIBLE_DEVICES" not in settings
        ):
            assumed = True
        else:
            roles = f"train {train}" + (
                f", rollout {'colocated' if colocate else rollout}, eval {ev}" if kind == "rl" else ""
            )
            raise PlanError(
                f"the split needs {need} GPUs ({roles}) but {len(ids)} are visible; "
                + (
                    "set TRAIN_GPUS/ROLLOUT_GPUS/EVAL_GPUS, COLOCATE=1, or EVAL_DEVICES"
                    if kind == "rl"
                    else "set TRAIN_GPUS"
                )
            )
    eval_devices = eval_named
    if kind == "rl" and not eval_named:
        eval_devices = _ids(ids, ray, ev)
        # a multi-node run (EVAL_FLEET) may keep this node for training and engines: its eval
        # servers are on the nodes that joined with eval GPUs
        if not eval_devices and not int(settings.get("EVAL_FLEET") or 0):
            raise PlanError(
                "EVAL_GPUS=0: set EVAL_DEVICES (e.g. cpu, or GPU ids shared with training), "
                "or EVAL_FLEET for eval GPUs on other nodes"
            )
    return GpuPlan(
        kind=kind,
        train=train,
        rollout=rollout,
        eval=ev,
        colocate=colocate,
        ray_num_gpus=ray,
        need=need,
        visible=len(ids),
        ray_devices=_ids(ids, 0, ray),
        eval_devices=eval_devices,
        assumed=assumed,
    )


RAY_PORTS = ("RAY_PORT", "RAY_DASHBOARD_PORT", "RAY_CLIENT_PORT", "RAY_AGENT_PORT")
PORTS = ("EVAL_PORT", "BUFFER_PORT", "ENGINE_PORT", "ROUTER_PORT", *RAY_PORTS)  # every port setting of a run


@dataclass(frozen=True)
class Endpoints:
    """Where the GRPO run's services are, and the ports its start must find free."""

    sglang_url: str  # what the agent runner and the plug-ins generate with
    eval_url: str
    buffer_url: str
    engine_health_url: str  # "" without an engine window
    slime_host_ip: str  # slime binds its router there: ROUTER_HOST
    ports: tuple[int, ...]

    def shell(self) -> dict[str, str]:
        return {
            "SGLANG_URL": self.sglang_url,
            "EVAL_URL": self.eval_url,
            "BUFFER_URL": self.buffer_url,
            "ENGINE_HEALTH_URL": self.engine_health_url,
            "SLIME_HOST_IP": self.slime_host_ip,
            "KRL_PORTS": " ".join(str(p) for p in self.ports),
        }


def plan_endpoints(settings: Mapping[str, str]) -> Endpoints:
    """The run's URLs (slime starts its router at ROUTER_HOST:ROUTER_PORT, SLIME_HOST_IP being
    ROUTER_HOST; ENGINE=tiny serves at ENGINE_PORT; SGLANG_URL set by hand wins) and its ports."""
    port = {n: _int(settings, n, "0") for n in PORTS}
    engine_tiny = settings.get("ENGINE") == "tiny"
    train_only = settings.get("TRAIN_ONLY") == "1"
    router_host = settings.get("ROUTER_HOST") or "127.0.0.1"
    health = settings.get("ENGINE_HEALTH_URL", "")
    sglang = settings.get("SGLANG_URL", "")
    if engine_tiny:
        health = health or f"http://127.0.0.1:{port['ENGINE_PORT']}/health"
        sglang = sglang or f"http://127.0.0.1:{port['ENGINE_PORT']}"
    if not sglang:
        if train_only:
            raise PlanError(
                "TRAIN_ONLY=1 starts no SGLang router: set ENGINE=tiny (an engine window serving HF_CKPT) "
                "or SGLANG_URL=http://HOST:PORT of a /generate server"
            )
        host = f"[{router_host}]" if ":" in router_host else router_host  # IPv6, bracketed as slime does
        sglang = f"http://{host}:{port['ROUTER_PORT']}"
    slime_ip = settings.get("SLIME_HOST_IP", "")
    if slime_ip and slime_ip != router_host:
        raise PlanError(
            f"SLIME_HOST_IP={slime_ip} differs from ROUTER_HOST={router_host}: slime binds its router to "
            "SLIME_HOST_IP; set only ROUTER_HOST"
        )
    ports = [port["EVAL_PORT"]]
    if settings.get("MODE", "buffer") == "buffer":
        ports.append(port["BUFFER_PORT"])
    if engine_tiny and not settings.get("ENGINE_CMD"):
        ports.append(port["ENGINE_PORT"])
    if not settings.get("TRAINER_CMD"):
        ports += [port[n] for n in RAY_PORTS]
        if not train_only:
            ports.append(port["ROUTER_PORT"])
    return Endpoints(
        sglang_url=sglang,
        eval_url=f"http://127.0.0.1:{port['EVAL_PORT']}",
        buffer_url=f"http://127.0.0.1:{port['BUFFER_PORT']}",
        engine_health_url=health,
        slime_host_ip=router_host,
        ports=tuple(ports),
    )


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.run_plan", __doc__)
    p.add_argument("--kind", choices=KINDS, default="rl", help="rl: the GRPO run; sft: the SFT run")
    p.add_argument("--shell", action="store_true", help="print KEY=VALUE lines for the launcher's eval")
    args = p.parse_args(argv)
    try:
        plan = plan_gpus(os.environ, visible_ids(os.environ), args.kind)
        endpoints = plan_endpoints(os.environ) if args.kind == "rl" else None
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.shell:
        for key, value in {**plan.shell(), **(endpoints.shell() if endpoints else {})}.items():
            print(f"{key}={shlex.quote(value)}")
        if plan.assumed:
            print(
                f"PRINT_ONLY: {plan.visible} GPU(s) visible; the GPU split is not checked: assuming the documented "
                "default split (docs/LAUNCH.md; unless TRAIN_GPUS/ROLLOUT_GPUS/EVAL_GPUS/COLOCATE/PRESET change it): "
                f"{plan.describe()}; set NUM_GPUS to check it",
                file=sys.stderr,
            )
    else:
        print(plan.describe())
        if endpoints:
            print(
                f"generate {endpoints.sglang_url}, eval {endpoints.eval_url}, buffer {endpoints.buffer_url}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
