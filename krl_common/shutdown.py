"""Ending long-running CLIs the same way whatever stops them, and one-line bind errors.

A process manager, `kill`, tmux closing its pane or an SSH session ending send SIGTERM or SIGHUP,
not SIGINT: without a handler Python dies at once and its children (eval workers, the tmux
session of a dry run, an embedded eval server) keep running. `interrupt_on_termination` turns
both into the KeyboardInterrupt that Ctrl-C raises, so the one cleanup path runs for all three.
"""

from __future__ import annotations

import errno
import signal
import socket
import sys
from types import FrameType
from typing import NoReturn

TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_received: list[int] = []  # the signal that `interrupt_on_termination` turned into Ctrl-C


def interrupt_on_termination() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread (as Ctrl-C does). Only the
    first one does: later ones are ignored, so a manager repeating SIGTERM cannot interrupt the
    cleanup that the first one started (SIGKILL still ends the process)."""

    def _interrupt(signum: int, _frame: FrameType | None) -> None:
        for sig in TERMINATION_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        _received.append(signum)
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, _interrupt)


def interrupted_exit_code() -> int:
    """The shell's exit status for the signal that stopped us: 143 (SIGTERM), 129 (SIGHUP), else
    130 (Ctrl-C), so a caller can tell who asked."""
    return 128 + (_received[0] if _received else signal.SIGINT)


def is_address_in_use(exc: BaseException) -> bool:
    """Whether a bind failed because something already listens there."""
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


def exit_port_in_use(prog: str, host: str, port: int, fix: str) -> NoReturn:
    """Print one line naming the port and how to choose another, and exit 1 (instead of the bind
    traceback, which hides the port among 20 lines of socket internals)."""
    where = port if host in ("127.0.0.1", "0.0.0.0", "", "localhost", "::") else f"{host}:{port}"
    print(f"{prog}: port {where} is in use (another server?): {fix}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def ensure_port_free(prog: str, host: str, port: int, fix: str) -> None:
    """`exit_port_in_use` before slow start-up work (loading a model) rather than after it: a
    trial bind, with SO_REUSEADDR as the HTTP servers set it. Port 0 (any free port) always passes."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if is_address_in_use(exc):
                exit_port_in_use(prog, host, port, fix)
            raise
