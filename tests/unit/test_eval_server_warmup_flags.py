"""The warm-up knobs: the server refuses unordered bounds at start (before any worker or torch),
Hardening refuses them too, and the flags reach the workers' Hardening."""

from __future__ import annotations

import pytest

from eval_server import __main__ as server_main
from eval_server.isolation.hardening import Hardening
from eval_server.pipeline.timing_phase import adaptive_settings


def test_server_refuses_a_busy_warm_up_longer_than_the_full_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        server_main.main(["--devices", "cpu", "--warmup-ms", "50", "--warmup-busy-ms", "80"])
    assert exc.value.code == 2
    assert "--warmup-busy-ms <= --warmup-ms" in capsys.readouterr().err


def test_flags_become_hardening_overrides() -> None:
    args = server_main.build_parser().parse_args(["--warmup-ms", "150", "--warmup-busy-ms", "150"])
    overrides = server_main.hardening_overrides(args)
    hard = Hardening(**overrides)
    assert (hard.warmup_ms, hard.warmup_busy_ms) == (150.0, 150.0)


def test_hardening_rejects_unordered_bounds() -> None:
    with pytest.raises(ValueError, match="warmup_busy_ms"):
        Hardening(warmup_ms=10.0, warmup_busy_ms=20.0)


def test_candidate_warm_up_is_the_busy_one_and_reference_the_full_one() -> None:
    hard = Hardening(warmup_ms=200.0, warmup_busy_ms=20.0)
    full, busy = adaptive_settings(hard), adaptive_settings(hard, busy=True)
    assert (full["min_warmup_ms"], full["max_warmup_ms"]) == (200.0, 200.0)
    assert (busy["min_warmup_ms"], busy["max_warmup_ms"]) == (20.0, 200.0)


def test_the_cuda_compile_limit_is_a_server_setting(capsys: pytest.CaptureFixture[str]) -> None:
    args = server_main.build_parser().parse_args(["--cuda-compile-timeout", "900"])
    assert Hardening(**server_main.hardening_overrides(args)).cuda_compile_timeout_s == 900.0
    assert Hardening().cuda_compile_timeout_s == 120.0
    with pytest.raises(SystemExit) as exc:
        server_main.main(["--devices", "cpu", "--cuda-compile-timeout", "0"])
    assert exc.value.code == 2
    assert "--cuda-compile-timeout" in capsys.readouterr().err
