"""Unit tests of eval_server.isolation.sandbox: environment scrubbing, killing a process tree, tree RSS."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from eval_server.isolation.sandbox import kill_tree, scrubbed_env, tree_rss_bytes

pytestmark = pytest.mark.unit

SECRETS = {
    "OPENAI_API_KEY": "sk-1",
    "HF_TOKEN": "hf_1",
    "WANDB_API_KEY": "w1",
    "AWS_SECRET_ACCESS_KEY": "a1",
    "GITHUB_TOKEN": "ghp_1",
    "TORCH_HUB_TOKEN": "t1",  # allowed prefix TORCH_, dropped for TOKEN
    "CUDA_PASSWORD": "p1",  # allowed prefix CUDA_, dropped for PASSWORD
    "TRITON_AUTH_HEADER": "x",
}
UNKNOWN = {
    "MY_APP_SETTING": "1",
    "HOME": "home-of-the-server-user",
    "USER": "me",
    "SSH_AUTH_SOCK": "agent.sock",
    "DATABASE_URL": "pg://",
}
KEPT = {
    "PATH": "bin-a:bin-b",
    "CUDA_VISIBLE_DEVICES": "3",
    "TRITON_INTERPRET": "1",
    "TRITON_CACHE_DIR": "triton-cache",
    "LC_ALL": "C.UTF-8",
    "LANG": "C.UTF-8",
    "LD_LIBRARY_PATH": "cuda-lib64",
    "PYTHONPATH": "repo",
    "TORCH_HOME": "torch-home",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "OMP_NUM_THREADS": "4",
}


# --------------------------------------------------------------------------- scrubbed_env


def test_scrubbed_env_keeps_allowed_and_drops_everything_else():
    env = scrubbed_env({**SECRETS, **UNKNOWN, **KEPT})
    assert env == KEPT


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_each_secret_dropped(name):
    assert scrubbed_env({name: "v", "PATH": "bin-dir"}) == {"PATH": "bin-dir"}


def test_secret_match_is_case_insensitive():
    assert scrubbed_env({"TRITON_api_key": "x", "TORCH_Session_id": "y"}) == {}


def test_overrides_applied_last():
    env = scrubbed_env(
        {"PATH": "bin-dir", "CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "5", "TRITON_INTERPRET": "1"},
    )
    assert env == {"PATH": "bin-dir", "CUDA_VISIBLE_DEVICES": "5", "TRITON_INTERPRET": "1"}


def test_does_not_mutate_base():
    base = {"PATH": "bin-dir", "HF_TOKEN": "x"}
    scrubbed_env(base, {"A": "1"})
    assert base == {"PATH": "bin-dir", "HF_TOKEN": "x"}


def test_real_environment_loses_secret(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    env = scrubbed_env(os.environ)
    assert "OPENAI_API_KEY" not in env
    assert env.get("PATH") == os.environ.get("PATH")


# --------------------------------------------------------------------------- kill_tree


def _gone(p: psutil.Process) -> bool:
    """Exited (a zombie counts: whoever adopted it reaps it, it runs no more code)."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _start_tree(script: str, expect: int) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """Start `bash -c script` as a session leader; wait until `expect` processes of the tree run `sleep`."""
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 5
    while True:
        leader = psutil.Process(proc.pid)
        procs = [leader, *leader.children(recursive=True)]
        names = []
        for p in procs:
            try:
                names.append(p.name())
            except psutil.NoSuchProcess:
                names.append("")
        if names.count("sleep") >= expect or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert names.count("sleep") >= expect, f"tree did not start: {list(zip(procs, names, strict=True))}"
    return proc, procs


def _cleanup(proc: subprocess.Popen, procs: list[psutil.Process]) -> None:
    """Kill whatever a failed test left behind, by pid (psutil refuses if a pid was reused)."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _wait_gone(procs: list[psutil.Process], timeout: float = 5.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if not _gone(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def test_kill_tree_kills_leader_and_child():
    proc, procs = _start_tree("sleep 60 & sleep 60", expect=2)
    try:
        assert len(procs) >= 2 and all(p.is_running() for p in procs)
        kill_tree(proc.pid)
        assert proc.wait(timeout=5) == -9
        assert _wait_gone(procs) == []
    finally:
        _cleanup(proc, procs)


def test_kill_tree_kills_descendant_in_another_process_group():
    # `setsid` moves the child out of the leader's process group: killpg alone would miss it.
    proc, procs = _start_tree("setsid sleep 60 & sleep 60", expect=2)
    try:
        assert len({os.getpgid(p.pid) for p in procs}) == 2
        kill_tree(proc.pid)
        proc.wait(timeout=5)
        assert _wait_gone(procs) == []
    finally:
        _cleanup(proc, procs)


def test_kill_tree_on_dead_pid_is_silent():
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    kill_tree(proc.pid)  # must not raise


# --------------------------------------------------------------------------- tree_rss_bytes


def test_tree_rss_live_and_dead():
    assert tree_rss_bytes(os.getpid()) > 10 * 1024 * 1024  # pytest with torch imported
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert tree_rss_bytes(proc.pid) > 0
    finally:
        proc.kill()
        proc.wait()
    assert tree_rss_bytes(proc.pid) == 0


def test_tree_rss_includes_children():
    proc, procs = _start_tree("sleep 60 & sleep 60", expect=2)
    try:
        leader_only = procs[0].memory_info().rss
        assert tree_rss_bytes(proc.pid) > leader_only
    finally:
        _cleanup(proc, procs)


def test_an_undumpable_process_reads_as_such_and_its_children_keep_the_default():
    """What the judge does after forking its runner (workers/worker.py)."""
    import os

    from eval_server.isolation import sandbox

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child = os.fork()
        if child == 0:
            os.read(w, 0)
            import time

            time.sleep(30)
            os._exit(0)
        ok = sandbox.become_undumpable()
        import ctypes

        got = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        other = open(f"/proc/{child}/status").read()  # noqa: SIM115 - the child's, still readable
        os.write(w, f"{int(ok)} {got} {int('Pid' in other)}".encode())
        os.kill(child, 9)
        os._exit(0)
    os.close(w)
    out = os.read(r, 100).decode().split()
    os.waitpid(pid, 0)
    assert out == ["1", "0", "1"]


_REAP_SCRIPT = """
import os, signal, sys, time
import psutil
from eval_server.isolation.sandbox import become_subreaper, reap_group
assert become_subreaper()
leader = os.fork()
if leader == 0:  # the judge: its own group, one child (the runner), then it exits first
    os.setpgid(0, 0)
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    os._exit(0)
os.waitpid(leader, 0)  # the judge is gone; the runner is now this process's child
(runner,) = psutil.Process().children()
assert os.getpgid(runner.pid) == leader
os.killpg(leader, signal.SIGKILL)
print("reaped", reap_group(leader, grace_s=60.0))
try:
    os.waitpid(runner.pid, os.WNOHANG)
    print("still a child")
except ChildProcessError:
    print("gone")
"""


def test_reap_group_leaves_no_zombie_of_a_killed_group():
    """The worker's case: the judge (group leader) is reaped, its runner was reparented to the
    worker (a subreaper) and is still dying when the evaluation ends: reap_group collects it
    (in a child interpreter: a subreaper pytest would collect every other test's orphans)."""
    done = subprocess.run([sys.executable, "-c", _REAP_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["reaped", "True", "gone"]


_STRAY_SCRIPT = """
import os, time
import psutil
from eval_server.isolation.sandbox import become_subreaper, kill_strays
assert become_subreaper()
r, w = os.pipe()
spare = os.fork()
if spare == 0:  # the prepared pair: kept
    time.sleep(60)
    os._exit(0)
evaluation = os.fork()
if evaluation == 0:  # the candidate's double fork: a new session, its parent gone at once
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(60)
            os._exit(0)
        os._exit(0)
    os._exit(0)
os.waitpid(evaluation, 0)
stray = int(os.read(r, 20))
while stray not in [c.pid for c in psutil.Process().children()]:  # reparented to the subreaper
    time.sleep(0.01)
killed = kill_strays(keep=spare)
while True:  # dead once this subreaper collects it
    try:
        if os.waitpid(stray, os.WNOHANG)[0] == stray:
            break
    except ChildProcessError:
        break
    time.sleep(0.01)
print(stray in killed and spare not in killed, psutil.pid_exists(stray), psutil.Process(spare).is_running())
os.kill(spare, 9)
os.waitpid(spare, 0)
"""


def test_a_process_that_escaped_its_evaluation_is_killed_and_the_spare_kept():
    """The worker's case after every evaluation (in a child interpreter, a subreaper of its own)."""
    done = subprocess.run([sys.executable, "-c", _STRAY_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "True"]


_GUARD_SCRIPT = """
import os, sys
from eval_server.isolation import sandbox
guard = sys.argv[1] == "1"
r, w = os.pipe()
go_r, go_w = os.pipe()
runner = os.fork()
if runner == 0:  # the candidate's process
    os.close(r)
    os.close(go_w)
    dropped = sandbox.drop_privileges() if guard else False
    os.read(go_r, 1)  # the judge has turned undumpable
    try:
        with open(f"/proc/{os.getppid()}/mem", "rb"):
            got = "opened"
    except PermissionError:
        got = "refused"
    os.write(w, f"{int(dropped)} {sandbox.privileges()} {got}".encode())
    os._exit(0)
if guard:
    sandbox.become_undumpable()
os.write(go_w, b"x")
os.close(w)
print(os.read(r, 500).decode())
os.waitpid(runner, 0)
"""


def _yama_scope() -> int:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except OSError:
        return 0


@pytest.mark.parametrize("guard", [True, False])
def test_a_runner_without_capabilities_cannot_open_its_undumpable_judges_memory(guard: bool) -> None:
    """What the worker does with `Hardening.ptrace_guard` (its judge and runner): the runner's
    route to the judge's memory through /proc is closed, as root too (the CI container's user)."""
    if not guard and (os.geteuid() != 0 or _yama_scope() > 0):
        pytest.skip("the unguarded control needs root without Yama, where the route is open")
    out = subprocess.run(
        [sys.executable, "-c", _GUARD_SCRIPT, str(int(guard))],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split(" ", 1)  # fmt: skip
    if guard:
        assert out[0] == "1"
        assert out[1].endswith("refused\n")
        assert all(f in out[1] for f in ("'CapEff': 0", "'CapPrm': 0", "'NoNewPrivs': 1"))
    else:
        assert out[1].endswith("opened\n")


_CONFINE_SCRIPT = """
import os, sys
from eval_server.isolation import sandbox
kept, outside = sys.argv[1], sys.argv[2]
os.chdir(kept)
left = sandbox.confine_writes([kept])
for path in (os.path.join(kept, "new.txt"), "relative.txt", os.path.join(outside, "new.txt")):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        print(path.rsplit("/", 1)[-1], "written")
    except OSError as exc:
        print(path.rsplit("/", 1)[-1], exc.strerror.replace(" ", "_"))
print("left", len(left))
"""


def test_a_confined_process_writes_only_where_it_was_let(tmp_path: Path) -> None:
    """What the runner does under --runner-read-only (its worker's directory kept writable),
    the working directory included; a kernel that refuses the namespaces skips it."""
    kept, outside = tmp_path / "worker", tmp_path / "elsewhere"
    kept.mkdir()
    outside.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _CONFINE_SCRIPT, str(kept), str(outside)], capture_output=True, text=True, timeout=60
    )
    if "unshare" in done.stderr and done.returncode != 0:
        pytest.skip(f"no user namespaces here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == [
        "new.txt written",
        "relative.txt written",
        "new.txt Read-only_file_system",
        "left 0",
    ]
    assert (kept / "relative.txt").exists() and not (outside / "new.txt").exists()
