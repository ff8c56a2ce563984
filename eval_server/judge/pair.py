"""The judge and its runner: one socketpair, one fork, before either process touches CUDA (a
CUDA context does not survive fork; the runner makes its own)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable


def fork_runner(runner_main: Callable[[socket.socket], None]) -> tuple[int, socket.socket]:
    """Fork a child that runs `runner_main(its end of the socket)` and exits; returns (pid, our end).
    The child shares this process's group, so whoever kills the group kills both."""
    ours, theirs = socket.socketpair()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            ours.close()
            runner_main(theirs)
        except BaseException:  # noqa: BLE001 - the runner's end is its exit status
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    return pid, ours
