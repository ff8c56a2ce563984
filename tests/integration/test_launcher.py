"""scripts/run_kbench_multiturn.sh and scripts/stop.sh for real: a private tmux server, the real
eval server (CPU) and buffer server in their windows, a harmless trainer command (no GPU here).

Checks: the windows and their order, per-window logs and PID files, health gating (a service
that dies or never answers stops the start and leaves nothing behind), busy ports refused, and
that stop.sh leaves no process of the run while an unrelated process survives; the in-slime mode
(no buffer window); the single-GPU tiny preset's real engine window; and bad input (missing or
unconverted checkpoints, a service that never gets healthy) stopping the start with one line that
names the fix and no process or tmux session left.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from krl_common.service import free_port
from tests.processes import still_running

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (apt-get install tmux)"),
]

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "scripts" / "run_kbench_multiturn.sh"
STOP = REPO / "scripts" / "stop.sh"


@pytest.fixture(scope="module")
def runner_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What the buffer's agent runner needs to start: prompt records and a tokenizer directory."""
    from eval_server.samples import load_problem
    from slime_ext.dev_engine.tiny_model import tiny_tokenizer
    from slime_ext.rollout.problems import PromptRecord, write_prompt_records

    root = tmp_path_factory.mktemp("runner_inputs")
    write_prompt_records(
        root / "prompts.jsonl", [PromptRecord("relu", 1, "relu", "relu", load_problem("relu"))]
    )
    tiny_tokenizer().save_pretrained(root / "tokenizer")
    return {"PROMPT_DATA": str(root / "prompts.jsonl"), "TOKENIZER": str(root / "tokenizer")}


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's HF directory, as `python -m slime_ext.dev_engine.tiny_model --out DIR` writes it."""
    from slime_ext.dev_engine.tiny_model import write_model_dir

    return write_model_dir(tmp_path_factory.mktemp("tiny") / "Qwen3-tiny")


def _env(tmp_path: Path, inputs: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("kernel_rl:\n  runner:\n    temperature: 0.8\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "SLIME_HOST_IP")}
    env.update(
        TMUX_SOCKET=str(tmp_path / "tmux.sock"),  # a private tmux server, removed with tmp_path
        RUNS_ROOT=str(tmp_path / "runs"),
        RUN_NAME="t",
        RECIPE=str(recipe),
        PYTHON=sys.executable,
        EVAL_DEVICES="cpu",
        EVAL_CPU_WORKERS="1",
        EVAL_PORT=str(free_port()),
        BUFFER_PORT=str(free_port()),
        HEALTH_TIMEOUT_S="120",
        STOP_TIMEOUT_S="20",
        SGLANG_URL="http://127.0.0.1:9",  # nothing generates here: the runner is never started
    )
    env.update(inputs or {})
    env.update(extra)
    return env


def _launch(env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(LAUNCH)], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def _stop(run_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(STOP), str(run_dir)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _tmux(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", "-S", env["TMUX_SOCKET"], *args], capture_output=True, text=True)


def _run_processes(run_dir: Path) -> set[int]:
    """Every live process of the run: the window process groups, their descendants, and every
    process whose environment carries the run id."""
    run_id = next(
        line.split("=", 1)[1]
        for line in (run_dir / "run.env").read_text().splitlines()
        if line.startswith("export KRL_RUN_ID=")
    )
    pids: set[int] = set()
    for pidfile in (run_dir / "pids").glob("*.pid"):
        leader = int(pidfile.read_text().split()[0])
        try:
            proc = psutil.Process(leader)
            pids |= {leader} | {c.pid for c in proc.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    for proc in psutil.process_iter(["environ"]):
        if f"KRL_RUN_ID={run_id}" in [f"{k}={v}" for k, v in (proc.info["environ"] or {}).items()]:
            pids.add(proc.pid)
    return {p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}


def test_windows_logs_health_order_and_clean_stop(tmp_path: Path, runner_inputs: dict[str, str]) -> None:
    env = _env(tmp_path, runner_inputs, TRAINER_CMD="echo trainer-window-up; sleep 600")
    run_dir = tmp_path / "runs" / "t"
    bystander = subprocess.Popen(["sleep", "600"])  # unrelated: must survive stop.sh
    try:
        res = _launch(env)
        assert res.returncode == 0, res.stderr + res.stdout
        windows = _tmux(env, "list-windows", "-t", "t", "-F", "#{window_name}").stdout.split()
        assert windows == ["eval", "buffer", "trainer", "status"]
        # Health gating: each window started only after the previous one answered /health.
        err = res.stderr
        assert err.index("eval is healthy") < err.index("starting window buffer")
        assert err.index("buffer is healthy") < err.index("starting window trainer")
        for name in ("eval", "buffer", "trainer"):
            assert (run_dir / "cmd" / f"{name}.sh").is_file()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "trainer-window-up" not in _read(
            run_dir / "logs" / "trainer.log"
        ):
            time.sleep(0.2)
        assert "trainer-window-up" in _read(run_dir / "logs" / "trainer.log")
        assert "buffer_server listening" in _read(run_dir / "logs" / "buffer.log")
        assert (run_dir / "logs" / "eval.log").stat().st_size > 0
        assert {p.name for p in (run_dir / "pids").glob("*.pid")} == {
            "eval.pid",
            "buffer.pid",
            "trainer.pid",
            "status.pid",
        }
        assert f"attach:  tmux -S {env['TMUX_SOCKET']} attach -t t" in res.stdout

        procs = _run_processes(run_dir)
        leaders = {int(p.read_text().split()[0]) for p in (run_dir / "pids").glob("*.pid")}
        assert leaders <= procs  # eval server, buffer server, trainer shell: all running
        assert any(psutil.Process(p).cmdline() == ["sleep", "600"] for p in procs)  # the trainer's child
        # A second launch of the same run is refused while it runs.
        again = _launch(env)
        assert again.returncode != 0 and "already exists" in again.stderr

        stop = _stop(run_dir, env)
        assert stop.returncode == 0, stop.stderr
        assert still_running(list(procs)) == [], "processes of the run survived stop.sh"
        assert _tmux(env, "has-session", "-t", "t").returncode != 0
        assert bystander.poll() is None, "stop.sh touched an unrelated process"
        assert (run_dir / "stopped").is_file()
        assert _stop(run_dir, env).returncode == 0  # idempotent
    finally:
        bystander.kill()
        bystander.wait()
        if (run_dir / "run.env").exists():
            _stop(run_dir, env)


def test_service_that_dies_stops_the_start(tmp_path: Path) -> None:
    env = _env(tmp_path, EVAL_CMD="echo eval-is-broken; exit 3", TRAINER_CMD="sleep 600")
    run_dir = tmp_path / "runs" / "t"
    t0 = time.monotonic()
    res = _launch(env)
    assert res.returncode == 1
    assert time.monotonic() - t0 < 60  # noticed the exit, did not wait for the timeout
    assert "eval exited before becoming healthy" in res.stderr
    assert "eval-is-broken" in res.stderr  # the log tail is shown
    last = res.stderr.strip().splitlines()[-1]  # one closing line naming the fix
    assert "ERROR: eval exited before answering" in last and str(run_dir / "logs" / "eval.log") in last
    assert not (run_dir / "pids" / "buffer.pid").exists()  # nothing after the failed window
    assert _tmux(env, "has-session", "-t", "t").returncode != 0
    assert _run_processes(run_dir) == set()


def test_health_timeout_stops_what_started(tmp_path: Path) -> None:
    env = _env(tmp_path, EVAL_CMD="echo starting; sleep 600", TRAINER_CMD="sleep 600", HEALTH_TIMEOUT_S="3")
    run_dir = tmp_path / "runs" / "t"
    res = _launch(env)
    assert res.returncode == 1
    assert "eval not healthy after 3 s" in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "ERROR: eval not healthy" in last and "raise HEALTH_TIMEOUT_S" in last
    assert still_running(list(_run_processes(run_dir))) == []
    assert _tmux(env, "has-session", "-t", "t").returncode != 0


def test_busy_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        env = _env(tmp_path, EVAL_PORT=str(s.getsockname()[1]), TRAINER_CMD="sleep 600")
        res = _launch(env)
    assert res.returncode == 1
    assert f"port {env['EVAL_PORT']} is in use" in res.stderr
    assert _tmux(env, "has-session", "-t", "t").returncode != 0


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _static_services_env(tmp_path: Path) -> dict[str, str]:
    """The launcher's env with the eval and buffer windows replaced by a static /health server."""
    www = tmp_path / "www"
    www.mkdir()
    (www / "health").write_text("ok")  # a static /health that answers 200
    env = _env(tmp_path)
    serve = f"{sys.executable} -m http.server --bind 127.0.0.1 --directory {www}"
    env.update(EVAL_CMD=f"{serve} {env['EVAL_PORT']}", BUFFER_CMD=f"{serve} {env['BUFFER_PORT']}")
    return env


def test_ctrl_c_in_a_window_stops_its_command_and_keeps_the_log(tmp_path: Path) -> None:
    env = _static_services_env(tmp_path)
    env.update(
        TRAINER_CMD="trap 'echo terminated; exit 5' TERM; echo ready; while true; do sleep 0.1; done",
        ON_EXIT="wait",  # the status window only shows the ended window
    )
    run_dir = tmp_path / "runs" / "t"
    try:
        res = _launch(env)
        assert res.returncode == 0, res.stderr
        log = run_dir / "logs" / "trainer.log"
        deadline = time.monotonic() + 30
        while "ready" not in _read(log) and time.monotonic() < deadline:
            time.sleep(0.1)
        _tmux(env, "send-keys", "-t", "t:trainer", "C-c")
        rc = run_dir / "pids" / "trainer.rc"
        deadline = time.monotonic() + 30
        while not rc.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rc.read_text().strip() == "5"
        deadline = time.monotonic() + 5
        while "command exited with code 5" not in _read(log) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "terminated" in _read(log) and "command exited with code 5" in _read(log)
        # The other windows are untouched; the ended one stays open with its last lines.
        assert _tmux(env, "list-windows", "-t", "t", "-F", "#{window_name}").stdout.split() == [
            "eval",
            "buffer",
            "trainer",
            "status",
        ]
    finally:
        _stop(run_dir, env)


def test_a_window_whose_command_ends_stops_the_run(tmp_path: Path) -> None:
    """ON_EXIT=stop (the default): the status window sees the trainer's command end (here with
    code 3) and stops the whole run, saying which window ended and how."""
    env = _static_services_env(tmp_path)
    env.update(
        TRAINER_CMD="echo 'trainer: giving up'; sleep 2; exit 3",
    )
    run_dir = tmp_path / "runs" / "t"
    try:
        res = _launch(env)
        assert res.returncode == 0, res.stderr
        deadline = time.monotonic() + 120
        while _tmux(env, "has-session", "-t", "t").returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _tmux(env, "has-session", "-t", "t").returncode != 0, "the run was not stopped"
        assert (run_dir / "pids" / "trainer.rc").read_text().strip() == "3"
        shown = re.sub(
            r"\x1b\[[0-9;?]*[a-zA-Z]", "", _read(run_dir / "logs" / "status.log")
        )  # drawn for the pane
        assert "window trainer exited with code 3" in shown and "stopping the run" in shown
        deadline = time.monotonic() + 30
        while _run_processes(run_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _run_processes(run_dir) == set()
    finally:
        _stop(run_dir, env)


def test_stop_finds_the_session_on_its_own_server_whatever_tmux_says(tmp_path: Path) -> None:
    """A run started on one tmux server (here the default server of a private TMUX_TMPDIR) and
    stopped from a pane of another (`$TMUX` names another socket): stop.sh addresses the server
    recorded at start, not the one `$TMUX` points to (it used to say "stopped" and leave it)."""
    tmux_dir = Path(tempfile.mkdtemp(prefix="tm"))  # short: a socket path has ~100 bytes
    env = _static_services_env(tmp_path)
    env.update(TMUX_SOCKET="", TMUX_TMPDIR=str(tmux_dir), TRAINER_CMD="sleep 600", ON_EXIT="wait")
    run_dir = tmp_path / "runs" / "t"
    default = ["tmux", "-S", str(tmux_dir / f"tmux-{os.getuid()}" / "default")]
    try:
        res = _launch(env)
        assert res.returncode == 0, res.stderr
        assert subprocess.run([*default, "has-session", "-t", "=t"]).returncode == 0
        other = {**env, "TMUX": f"{tmux_dir / 'other.sock'},1,0"}  # a pane of another server
        stopped = _stop(run_dir, other)
        assert stopped.returncode == 0, stopped.stderr
        assert "tmux session t closed" in stopped.stderr
        assert subprocess.run([*default, "has-session", "-t", "=t"], capture_output=True).returncode != 0
    finally:
        _stop(run_dir, env)
        subprocess.run([*default, "kill-server"], capture_output=True)
        shutil.rmtree(tmux_dir, ignore_errors=True)


def test_in_slime_mode_runs_without_a_buffer_window(tmp_path: Path, runner_inputs: dict[str, str]) -> None:
    env = _env(tmp_path, runner_inputs, MODE="in_slime", TRAINER_CMD="echo in-slime-trainer; sleep 600")
    run_dir = tmp_path / "runs" / "t"
    try:
        res = _launch(env)
        assert res.returncode == 0, res.stderr + res.stdout
        assert _tmux(env, "list-windows", "-t", "t", "-F", "#{window_name}").stdout.split() == [
            "eval",
            "trainer",
            "status",
        ]
        assert {p.name for p in (run_dir / "pids").glob("*.pid")} == {"eval.pid", "trainer.pid", "status.pid"}
        assert (run_dir / "prompts_train.jsonl").is_file()
        procs = _run_processes(run_dir)
        assert _stop(run_dir, env).returncode == 0
        assert still_running(list(procs)) == []
        assert _tmux(env, "has-session", "-t", "t").returncode != 0
    finally:
        _stop(run_dir, env)


def _trainer_requirements(tmp_path: Path) -> dict[str, str]:
    """What the gate checks first, made here: slime's and Megatron-LM's source markers, and a Ray
    distribution record (a TEST DOUBLE of the installed package: metadata only, nothing of Ray
    runs in these tests; the gate only asks whether it is installed)."""
    (tmp_path / "slime").mkdir(exist_ok=True)
    (tmp_path / "slime" / "train.py").write_text("")
    (tmp_path / "mlm" / "megatron").mkdir(parents=True, exist_ok=True)
    dist = tmp_path / "site" / "ray-2.60.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 2.60.0\n")
    path = os.environ.get("PYTHONPATH")
    return {
        "SLIME_DIR": str(tmp_path / "slime"),
        "MEGATRON_DIR": str(tmp_path / "mlm"),
        "PYTHONPATH": str(tmp_path / "site") + (f":{path}" if path else ""),
    }


def _preset_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """PRESET=single_gpu_tiny TRAIN_ONLY=1 on this CPU machine: the eval server on the CPU."""
    return _env(
        tmp_path,
        PRESET="single_gpu_tiny",
        TRAIN_ONLY="1",
        ENGINE_PORT=str(free_port()),
        EVAL_DEVICES="cpu",
        SGLANG_URL="",  # the preset's engine
        ENGINE_ARGS="--device cpu",  # the preset's default puts the engine on the GPU
        **extra,
    )


def test_single_gpu_tiny_preset_starts_its_engine(
    tmp_path: Path, runner_inputs: dict[str, str], tiny_hf: Path
) -> None:
    env = _preset_env(tmp_path, **runner_inputs, HF_CKPT=str(tiny_hf), TRAINER_CMD="sleep 600")
    run_dir = tmp_path / "runs" / "t"
    try:
        res = _launch(env)
        assert res.returncode == 0, res.stderr + res.stdout
        windows = _tmux(env, "list-windows", "-t", "t", "-F", "#{window_name}").stdout.split()
        assert windows == ["engine", "eval", "buffer", "trainer", "status"]
        assert res.stderr.index("engine is healthy") < res.stderr.index("starting window eval")
        info = json.loads(
            urllib.request.urlopen(f"http://127.0.0.1:{env['ENGINE_PORT']}/get_model_info", timeout=10).read()
        )
        assert Path(info["model_path"]) == tiny_hf
        procs = _run_processes(run_dir)
        assert _stop(run_dir, env).returncode == 0
        assert still_running(list(procs)) == []
    finally:
        _stop(run_dir, env)


def test_engine_that_cannot_load_its_model_stops_the_start(tmp_path: Path) -> None:
    env = _preset_env(tmp_path, HF_CKPT=str(tmp_path / "no-model"), TRAINER_CMD="sleep 600")
    run_dir = tmp_path / "runs" / "t"
    res = _launch(env)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert "ERROR: engine exited before answering" in last and "engine.log" in last
    assert not (run_dir / "pids" / "eval.pid").exists()
    assert _tmux(env, "has-session", "-t", "t").returncode != 0
    assert still_running(list(_run_processes(run_dir))) == []


def _torch_dist_root(path: Path, iteration: str | None = "release", shards: bool = True) -> Path:
    path.mkdir(parents=True)
    if iteration is not None:
        (path / "latest_checkpointed_iteration.txt").write_text(iteration)
    if shards:
        (path / "release").mkdir()
        (path / "release" / ".metadata").write_bytes(b"x")
        (path / "release" / "__0_0.distcp").write_bytes(b"x")
    return path


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no_hf", "hf checkpoint: {hf} not found -> fix: put the HF model there"),
        (
            "no_ref",
            "ref load: {ref} not found -> fix: convert the HF model: scripts/convert_hf_to_megatron.sh --hf-dir {hf} --out {ref}",
        ),
        (
            "ref_not_converted",
            "ref load: {ref}: neither torch_dist (latest_checkpointed_iteration.txt) nor HF -> fix: convert",
        ),
        (
            "ref_iteration_missing",
            "ref load: {ref}/latest_checkpointed_iteration.txt says 'release' but {ref}/release is missing",
        ),
        ("no_prompts", "prompt data: {prompts} not found -> fix: prepare it"),
        ("no_slime", "slime: {tmp}/no-slime/train.py not found -> fix: run inside the slime image"),
    ],
)
def test_bad_input_stops_the_start_with_one_line(
    tmp_path: Path, tiny_hf: Path, runner_inputs: dict[str, str], case: str, expected: str
) -> None:
    """The real trainer command (no TRAINER_CMD): what slime would read at start is checked before
    anything starts; the launcher ends with one line naming the problem and its fix."""
    hf, ref = tiny_hf, tmp_path / "ckpt" / "Qwen3-tiny_torch_dist"
    prompts = runner_inputs["PROMPT_DATA"]
    if case == "no_hf":
        hf = tmp_path / "ckpt" / "Qwen3-tiny"
    elif case == "ref_not_converted":
        ref.mkdir(parents=True)
        (ref / "model.pt").write_bytes(b"x")
    elif case == "ref_iteration_missing":
        _torch_dist_root(ref, shards=False)
    elif case == "no_prompts":
        _torch_dist_root(ref)
        prompts = str(tmp_path / "none.jsonl")
    env = _preset_env(
        tmp_path,
        NUM_GPUS="1",
        HF_CKPT=str(hf),
        REF_LOAD=str(ref),
        PROMPT_DATA=prompts,
        TOKENIZER=str(tiny_hf),
        **_trainer_requirements(tmp_path),
    )
    if case == "no_slime":
        env["SLIME_DIR"] = str(tmp_path / "no-slime")
    res = _launch(env, timeout=120)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert (
        lines[-1]
        .split("ERROR: ", 1)[1]
        .startswith(expected.format(hf=hf, ref=ref, prompts=prompts, tmp=tmp_path))
    )
    assert sum("ERROR" in line for line in lines) == 1
    run_dir = tmp_path / "runs" / "t"
    assert not (run_dir / "pids").exists() and not (run_dir / "cmd").exists()  # nothing started
    assert _tmux(env, "has-session", "-t", "t").returncode != 0


@pytest.mark.parametrize(
    ("train_only", "size", "hf_name", "layers"),
    [("1", "tiny", "Qwen3-tiny", 2), ("0", "hd64", "Qwen3-tiny-hd64", 4)],
)
def test_gate_passes_on_the_prepared_tiny_model(
    tmp_path: Path,
    tiny_hf: Path,
    runner_inputs: dict[str, str],
    train_only: str,
    size: str,
    hf_name: str,
    layers: int,
) -> None:
    """The preparation docs/LAUNCH.md gives for the preset (tiny model, CPU conversion) satisfies
    the launcher's gate with the preset's own model args: configs/models/qwen3-tiny.sh with
    TRAIN_ONLY=1, configs/models/qwen3-tiny-hd64.sh (`tiny_model --size hd64`) without."""
    from slime_ext.dev_engine.tiny_model import write_model_dir

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    if size == "tiny":
        os.symlink(tiny_hf, ckpt / hf_name)
    else:
        write_model_dir(ckpt / hf_name, size=size)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_CKPT", "REF_LOAD", "MODEL_ARGS_FILE", "MODEL", "HF_NAME", "TRAIN_ONLY")
    }
    env.update(
        PRESET="single_gpu_tiny",
        TRAIN_ONLY=train_only,
        CKPT_ROOT=str(ckpt),
        PROMPT_DATA=runner_inputs["PROMPT_DATA"],
    )
    env.update(_trainer_requirements(tmp_path))
    conv = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.convert_hf_to_megatron",
            "--hf-dir",
            str(ckpt / hf_name),
            "--out",
            str(ckpt / f"{hf_name}_torch_dist"),
            "--dtype",
            "bf16",
            "--no-progress",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert conv.returncode == 0, conv.stderr

    def gate() -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "tools.preflight", "--gate"]
        return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)

    ok = gate()
    assert ok.returncode == 0 and ok.stdout == "", ok.stdout + ok.stderr
    # the same files with another model's args: refused, naming the mismatch
    env["MODEL"] = "qwen3-0.6B"
    wrong = gate()
    assert (
        wrong.returncode == 1
        and wrong.stdout.startswith("model args: ")
        and f"--num-layers 28 vs num_hidden_layers {layers}" in wrong.stdout
    )
