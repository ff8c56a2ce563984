"""What the GPU tests of the trainer share: a launcher run until its trainer window's command
ends, an SGLang server for the duration of a block, and where their logs are kept
(`KRL_GPU_ARTIFACTS`). Not a test module."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from krl_common.service import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[2]
LOG_COPY_EVERY_S = 30.0  # while a run goes on, its logs reach the artifacts this often


# The launcher's port settings (configs/run/common.sh): fixed defaults, so two runs on one machine
# collide unless each has its own
PORT_SETTINGS = ("EVAL_PORT", "BUFFER_PORT", "ROUTER_PORT", "ENGINE_PORT", "RAY_PORT", "RAY_DASHBOARD_PORT",
                 "RAY_CLIENT_PORT", "RAY_AGENT_PORT")  # fmt: skip
RAY_WORKER_PORTS = (10002, 19999)  # Ray's default worker port range


def launcher_env() -> dict[str, str]:
    """The caller's environment for a launcher run (TMUX dropped: the runs make their own sessions)
    with a free port for each port setting the caller did not set, so GPU tests can run side by
    side on one machine, each confined to its GPUs with CUDA_VISIBLE_DEVICES: distinct, and outside
    Ray's worker ports, which `ray start` refuses for its other components."""
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    taken = {env[name] for name in PORT_SETTINGS if name in env}
    for name in PORT_SETTINGS:
        if name in env:
            continue
        for _ in range(1000):
            port = str(free_port())
            if port not in taken and not RAY_WORKER_PORTS[0] <= int(port) <= RAY_WORKER_PORTS[1]:
                break
        else:
            raise RuntimeError(f"no free port for {name} outside Ray's worker ports {RAY_WORKER_PORTS}")
        env[name] = port
        taken.add(port)
    return env


def artifacts() -> Path | None:
    """KRL_GPU_ARTIFACTS as a folder, or None."""
    out = os.environ.get("KRL_GPU_ARTIFACTS")
    return Path(out) if out else None


def _copy_logs(run_dir: Path, label: str) -> None:
    art = artifacts()
    if art is not None and (run_dir / "logs").is_dir():
        shutil.copytree(run_dir / "logs", art / f"logs-{label}", dirs_exist_ok=True)


def run_launcher(
    script: str,
    env: dict[str, str],
    label: str,
    timeout_s: float,
    *,
    plots: bool = False,
    what: str = "trainer",
) -> tuple[Path, str, float]:
    """`scripts/<script>` as a user starts it, until the trainer window's command ends (its
    pids/trainer.rc), copying the logs into the artifacts as it goes (a device call cut short
    still brings them back); then scripts/stop.sh, optionally tools.plot_run. Asserts the command
    exited 0; returns the run dir, slime's log and the wall time."""
    run_dir = Path(env["RUNS_ROOT"]) / env["RUN_NAME"]
    rc_file = run_dir / "pids" / "trainer.rc"
    rc_file.unlink(missing_ok=True)  # a resumed run: the last one's exit code is not this one's
    t0 = last_copy = time.monotonic()
    try:
        run_checked(["bash", f"scripts/{script}"], env)
        while not rc_file.exists() and time.monotonic() - t0 < timeout_s:
            time.sleep(5)
            if time.monotonic() - last_copy >= LOG_COPY_EVERY_S:
                _copy_logs(run_dir, label)
                last_copy = time.monotonic()
        rc = rc_file.read_text().strip() if rc_file.exists() else None
    finally:
        subprocess.run(
            ["bash", "scripts/stop.sh", str(run_dir)], cwd=REPO, env=env, capture_output=True, timeout=300
        )
        if plots:
            subprocess.run(
                [sys.executable, "-m", "tools.plot_run", str(run_dir)], cwd=REPO, env=env, capture_output=True
            )
        _copy_logs(run_dir, label)
        if plots and (art := artifacts()) is not None and (run_dir / "plots").is_dir():
            shutil.copytree(run_dir / "plots", art / f"plots-{label}", dirs_exist_ok=True)
    log = (run_dir / "logs" / "trainer.log").read_text(errors="replace")
    wall = time.monotonic() - t0
    assert rc == "0", f"{what} exited with {rc} after {wall:.0f} s:\n{log[-6000:]}"
    return run_dir, log, wall


def log_since(log: str, earlier: str) -> str:
    """What a relaunch of the same RUN_NAME added to slime's log (the log continues the earlier
    launch's when the file was kept, else it is all new)."""
    return log[len(earlier) :] if log.startswith(earlier) else log


def run_checked(cmd: list[str], env: dict[str, str], timeout: float = 600) -> str:
    """`cmd` from the checkout; asserts exit 0 (with both outputs); returns stdout."""
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@contextmanager
def sglang_server(
    model_dir: Path,
    log_path: Path,
    *,
    attention_backend: str = "triton",
    start_timeout_s: float = 600,
    keep_log_as: str | None = None,
) -> Iterator[str]:
    """`python -m sglang.launch_server` on GPU 0 serving `model_dir` (bf16, pytorch sampling,
    no CUDA graphs: the settings the serving test checks), its URL once /get_model_info answers;
    its process group stopped at the end, the log kept in the artifacts as `keep_log_as`."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
        "--attention-backend", attention_backend, "--sampling-backend", "pytorch",
        "--dtype", "bfloat16", "--mem-fraction-static", "0.3", "--disable-cuda-graph",
        "--skip-server-warmup", "--random-seed", "0",
    ]  # fmt: skip
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, start_timeout_s, log_path, health_path="/get_model_info", name="sglang")
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        if keep_log_as and (out := artifacts()) is not None:
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(log_path, out / keep_log_as)
