"""Server flags that become Hardening fields: checked at start (before any worker or torch), by
Hardening too; timing flags the judge does not read are gone, not silently ignored; and the header
line a worker writes before each request."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval_server import __main__ as server_main
from eval_server.isolation import sandbox
from eval_server.isolation.hardening import Hardening
from eval_server.workers.worker import parse_request_header, request_header


def test_the_cuda_compile_limit_is_a_server_setting(capsys: pytest.CaptureFixture[str]) -> None:
    args = server_main.build_parser().parse_args(["--cuda-compile-timeout", "900"])
    assert Hardening(**server_main.hardening_overrides(args)).cuda_compile_timeout_s == 900.0
    assert Hardening().cuda_compile_timeout_s == 120.0
    with pytest.raises(SystemExit) as exc:
        server_main.main(["--devices", "cpu", "--cuda-compile-timeout", "0"])
    assert exc.value.code == 2
    assert "--cuda-compile-timeout" in capsys.readouterr().err


def test_the_judges_timing_flags_reach_hardening() -> None:
    args = server_main.build_parser().parse_args(
        ["--timing-ci", "0.002", "--drift-tolerance", "0.1", "--reference-max-age", "30"]
    )
    hard = Hardening(**server_main.hardening_overrides(args))
    assert (hard.timing_ci_rel, hard.drift_tolerance, hard.reference_max_age_s) == (0.002, 0.1, 30.0)


def test_compiles_hold_the_gpu_lock_unless_the_server_says_otherwise() -> None:
    """--compile-unlocked (pipeline/compile_pause.py, shapes.warm) is off until measured."""
    default = server_main.build_parser().parse_args([])
    assert Hardening(**server_main.hardening_overrides(default)).compile_unlocked is False
    on = server_main.build_parser().parse_args(["--compile-unlocked"])
    assert Hardening(**server_main.hardening_overrides(on)).compile_unlocked is True


def test_read_only_runners_are_on_wherever_the_kernel_grants_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--runner-read-only: auto by default (the kernel asked once at start), `on` for the bare
    flag (the worker then refuses to start without it), `off`."""
    parse = server_main.build_parser().parse_args
    assert [
        parse(a).runner_read_only for a in ([], ["--runner-read-only"], ["--runner-read-only", "off"])
    ] == [
        "auto",
        "on",
        "off",
    ]
    assert server_main.runner_read_only("on", tmp_path) and not server_main.runner_read_only("off", tmp_path)
    granted = not sandbox.confinement_refused([str(tmp_path)])  # this machine's real answer
    assert server_main.runner_read_only("auto", tmp_path) is granted
    # a container that refuses user namespaces (Docker's default seccomp profile): a test double
    # of the kernel's answer, so that machines which grant them test the fallback too
    monkeypatch.setattr(
        sandbox,
        "confinement_refused",
        lambda paths: "unshare(CLONE_NEWUSER | CLONE_NEWNS): Operation not permitted",
    )
    assert server_main.runner_read_only("auto", tmp_path) is False
    assert server_main.runner_read_only("on", tmp_path) is True  # the worker's own probe then stops it


@pytest.mark.parametrize("age", ["0", "-1", "nan", "inf"])
def test_a_reference_max_age_must_be_positive_and_finite(
    age: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        server_main.main(["--devices", "cpu", "--reference-max-age", age])
    assert exc.value.code == 2
    assert "--reference-max-age" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--warmup-busy-ms", "--warmup-ms", "--warm-gap-s", "--long-trial-ci"])
def test_flags_of_the_former_in_process_timing_are_refused(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        server_main.build_parser().parse_args([flag, "1"])
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("alone", [False, True])
def test_request_header_round_trip(alone: bool) -> None:
    known = [{"key": "k", "stats": {"median_ms": 1.0}, "note": "line\nbreak"}]
    line = request_header(99.25, alone, known)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert parse_request_header(line.rstrip(b"\n")) == (99.25, alone, known)
    assert parse_request_header(request_header(1.5).rstrip(b"\n")) == (1.5, False, [])
