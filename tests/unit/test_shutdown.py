"""krl_common.shutdown: SIGTERM and SIGHUP take the Ctrl-C path (KeyboardInterrupt in the main
thread), a second signal cannot interrupt the cleanup the first started, and the exit status
says which signal it was (what tools.dry_run, tools.eval_samples and the servers rely on)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROGRAM = """
import os, signal, sys, time
from krl_common.shutdown import interrupt_on_termination, interrupted_exit_code
interrupt_on_termination()
try:
    print("ready", flush=True)  # inside: the signal may come before print returns (busy machines)
    while True:
        time.sleep(0.05)
except KeyboardInterrupt as exc:
    print(f"interrupted: {exc}", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # a second signal while cleaning up: ignored
    print("cleaned up", flush=True)
    sys.exit(interrupted_exit_code())
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_termination_signal_is_a_ctrl_c_and_its_exit_status_names_it(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert out.splitlines() == [f"interrupted: {sig.name} received", "cleaned up"], (out, err)
