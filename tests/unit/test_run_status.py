"""The run status snapshot (slime_ext/reports/run_status.py) and tools/status.py, on a run
directory built here as the launcher and scripts/lib/window.sh write it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slime_ext.reports import run_status
from slime_ext.reports.plots import run_curve_series
from tools import status

pytestmark = pytest.mark.unit

SLIME_LOG = (
    "(MegatronTrainRayActor) model.py:918 - step 0: {'train/loss': -0.0777, 'train/grad_norm': 0.2067, "
    "'train/kl_loss': 0.0}\n"
    "(RolloutManager) rollout_metrics.py:268 - perf 0: {'rollout/kernel/correct_rate': 0.875, "
    "'rollout/kernel/reward_mean': 0.41}\n"
    "noise - step 1: {'train/loss': broken\n"
    "(MegatronTrainRayActor) model.py:918 - step 1: {'train/loss': -0.0801, 'train/grad_norm': 0.3117}\n"
)


def _run_dir(tmp_path: Path, *, trainer_rc: int | None = None) -> Path:
    run = tmp_path / "run"
    for sub in ("cmd", "pids", "logs"):
        (run / sub).mkdir(parents=True)
    (run / "run.env").write_text("export RUN_NAME=demo\nexport TMUX_SESSION=demo\nexport EVAL_PORT=9\n")
    for name in ("eval", "trainer", "status"):
        (run / "cmd" / f"{name}.sh").write_text("true\n")
        (run / "pids" / f"{name}.pid").write_text("123 456\n")
    (run / "logs" / "eval.log").write_text("starting\nworker 0 ready\n\n")
    (run / "logs" / "trainer.log").write_text(SLIME_LOG)
    if trainer_rc is not None:
        (run / "pids" / "trainer.rc").write_text(f"{trainer_rc}\n")
        with open(run / "logs" / "trainer.log", "a") as f:
            f.write("Traceback ... CUDA out of memory\n")
    return run


def test_slimes_step_lines_are_parsed_and_broken_ones_skipped() -> None:
    train, rollout = run_status.parse_slime_log(SLIME_LOG)
    assert train == {0: {"train/loss": -0.0777, "train/grad_norm": 0.2067, "train/kl_loss": 0.0},
                     1: {"train/loss": -0.0801, "train/grad_norm": 0.3117}}  # fmt: skip
    assert rollout == {0: {"rollout/kernel/correct_rate": 0.875, "rollout/kernel/reward_mean": 0.41}}


def test_windows_say_running_or_exited_with_code_and_last_line(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, trainer_rc=1)
    states = {w.name: w for w in run_status.window_states(run)}
    assert set(states) == {"eval", "trainer"}  # the status window does not watch itself
    assert (states["eval"].state, states["eval"].last_line) == ("running", "worker 0 ready")
    assert (states["trainer"].state, states["trainer"].exit_code) == ("exited", 1)
    assert "out of memory" in states["trainer"].last_line


def test_snapshot_and_history_keep_one_line_per_step(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    snap = run_status.snapshot(run, now=1000.0)
    assert snap["run"] == "demo" and snap["train_step"] == 1 and snap["rollout_step"] == 0
    assert snap["train"]["train/loss"] == -0.0801
    assert snap["recent_rollouts"] == [
        {"step": 0, "mean_return": None, "correct_rate": 0.875, "compile_rate": None}
    ]
    assert snap["eval"] is None and snap["buffer"] is None  # nothing listens on port 9; no buffer
    assert run_status.append_history(run, snap) is True
    assert run_status.append_history(run, snap) is False  # the same step again
    with open(run / "logs" / "trainer.log", "a") as f:
        f.write("x - step 2: {'train/loss': -0.1}\n")
    assert run_status.append_history(run, run_status.snapshot(run)) is True
    rows = [json.loads(line) for line in (run / run_status.HISTORY_NAME).read_text().splitlines()]
    assert [r["train_step"] for r in rows] == [1, 2]


def test_status_once_renders_and_on_exit_stop_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_dir(tmp_path, trainer_rc=1)
    assert status.main([str(run), "--once"]) == 0
    out = capsys.readouterr().out
    assert "exited (1)" in out and "unreachable" in out and "-0.0801" in out
    stopped: list[Path] = []
    monkeypatch.setattr(status, "_stop_run", stopped.append)
    assert status.main([str(run), "--on-exit", "stop", "--interval", "0.01"]) == 0
    assert stopped == [run]
    shown = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", capsys.readouterr().out)  # drawn for a pane: colours
    assert "window trainer exited with code 1" in shown and "out of memory" in shown


def test_status_refuses_a_directory_that_is_not_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status.main([str(tmp_path), "--once"]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_plot_run_draws_the_curves_the_run_logged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tools import plot_run

    run = _run_dir(tmp_path)
    lines = []
    for step in range(4):
        lines.append(f"x model.py:918 - step {step}: {{'train/loss': {-0.1 * step}, 'train/grad_norm': 0.3}}")
        lines.append(
            f"x rollout_metrics.py:268 - perf {step}: {{'rollout/kernel/mean_return': {0.2 + 0.1 * step}, "
            f"'rollout/kernel/correct_rate': 0.5, 'rollout/kernel/turn0/correct_rate': 0.4, "
            f"'rollout/kernel/turn1/correct_rate': 0.6, 'rollout/kernel/episode_s/mean': 9.0, "
            f"'rollout/kernel/episode_generate_s/mean': 3.0, 'rollout/kernel/episode_eval_s/mean': 6.0, "
            f"'rollout/kernel/eval_latency_s/mean': 4.0, 'rollout/kernel/eval_phase_s/compile/mean': 1.5, "
            f"'rollout/kernel/eval_phase_s/static/mean': 0.01}}"
        )
        lines.append(f"x train_metric_utils.py:401 - perf {step}: {{'perf/train_time': 12.5}}")
    (run / "logs" / "trainer.log").write_text("\n".join(lines) + "\n")
    # a status row per step, 30 s apart: 10 evaluations more each time on GPU 0, 5 more on GPU 1
    (run / run_status.HISTORY_NAME).write_text(
        "".join(
            json.dumps({"time": 1000.0 + 30 * s, "train_step": s, "rollout_step": s,
                        "eval": {"per_min": 60.0 + s, "evaluations": 15 * s,
                                 "by_device": {"cuda:0": 10 * s, "cuda:1": 5 * s}}}) + "\n"
            for s in range(4)
        )
    )  # fmt: skip
    rows = plot_run.step_rows(run)
    assert rows[3]["rollout/kernel/mean_return"] == pytest.approx(0.5)
    assert rows[3]["perf/train_time"] == 12.5 and rows[3]["eval/per_min"] == 63.0  # both perf lines kept
    # in the loop: the evaluations between two rows over the time between them, overall and per GPU
    assert rows[3]["eval/per_min_window"] == pytest.approx(30.0) and "eval/per_min_window" not in rows[0]
    assert rows[2]["eval/per_min/cuda:0"] == pytest.approx(20.0) and rows[2]["eval/per_min/cuda:1"] == 10.0
    assert [label for label, _ in run_curve_series("evals_per_min", rows)] == [
        "since start", "in the loop", "cuda:0", "cuda:1",
    ]  # fmt: skip
    assert plot_run.main([str(run)]) == 0
    written = {p.name for p in (run / "plots").glob("*.png")}
    assert written == {"reward.png", "correct_rate.png", "loss.png", "grad_norm.png", "evals_per_min.png",
                       "step_time.png", "episode_time.png", "eval_phases.png"}  # fmt: skip
    # the phases that took time are lines; one that never reached MIN_PHASE_S is left off
    assert run_curve_series("eval_phases", rows) == [
        ("server total", "rollout/kernel/eval_latency_s/mean"), ("compile", "rollout/kernel/eval_phase_s/compile/mean"),
    ]  # fmt: skip
    assert all((run / "plots" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in written)
    assert "not logged by this run: kl" in capsys.readouterr().out
    empty = tmp_path / "empty"
    (empty / "logs").mkdir(parents=True)
    assert plot_run.main([str(empty)]) == 1


def test_gpu_use_is_read_from_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi's CSV (its documented --query-gpu output, no GPU here: the command is a
    labelled test double of the tool's output)."""
    import subprocess

    out = "0, 87, 61234, 81559\n1, 0, 3, 81559\n"
    monkeypatch.setattr(run_status.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(
        run_status.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a[0], 0, stdout=out)
    )
    assert run_status._gpus() == [
        {"index": 0, "util_pct": 87.0, "mem_used_mib": 61234.0, "mem_total_mib": 81559.0},
        {"index": 1, "util_pct": 0.0, "mem_used_mib": 3.0, "mem_total_mib": 81559.0},
    ]
    monkeypatch.setattr(run_status.shutil, "which", lambda name: None)
    assert run_status._gpus() is None  # no nvidia-smi: no GPU row


def test_eval_section_counts_evaluations_per_device() -> None:
    """The eval server's per-worker counts (its /stats `per_worker`) summed per device: what the
    history keeps for the per-GPU rate in the loop."""
    stats = {
        "uptime_s": 60.0,
        "evaluations": 7,
        "per_worker": [
            {"id": 0, "device": "cuda:0", "evaluations": 3},
            {"id": 1, "device": "cuda:0", "evaluations": 2},
            {"id": 2, "device": "cuda:1", "evaluations": 2},
        ],
    }
    section = run_status._eval_section(stats)
    assert section is not None and section["per_min"] == 7.0
    assert section["by_device"] == {"cuda:0": 5, "cuda:1": 2}


def test_status_shows_the_current_evaluation_rate_per_device(tmp_path: Path) -> None:
    """Beside the rate since the eval server started, the status window shows the rate over its
    last minute of snapshots, per device when there are several."""
    from rich.console import Console

    run = _run_dir(tmp_path)

    def with_eval(now: float, counts: dict[str, int]) -> dict:
        snap = run_status.snapshot(run, now=now)
        workers = [{"device": d, "evaluations": n} for d, n in counts.items()]
        snap["eval"] = run_status._eval_section(
            {"uptime_s": now - 900.0, "evaluations": sum(counts.values()), "per_worker": workers}
        )
        return snap

    earlier = with_eval(1000.0, {"cuda:2": 10, "cuda:3": 4})
    snap = with_eval(1060.0, {"cuda:2": 30, "cuda:3": 9})
    assert status._now_rate(earlier, snap) == ", now 25/min (cuda:2 20, cuda:3 5)"
    assert status._now_rate(None, snap) == ""
    console = Console(record=True, width=250)
    console.print(status.render(snap, earlier))
    assert "now 25/min (cuda:2 20, cuda:3 5)" in console.export_text()


def test_truncated_episodes_are_counted_once() -> None:
    """The runner counts a truncated episode among its completed ones (agent_runner.py): a 10-episode
    dry run whose episodes all hit max_turns is 10/10 done, not 20/10."""
    stats = {
        "runner": {
            "configured": True,
            "finished": True,
            "prompts": 5,
            "group_size": 2,
            "epochs": 1,
            "episodes": {"completed": 10, "truncated": 10, "aborted": 0},
        }
    }
    runner = run_status._buffer_section(stats, now=100.0)["runner"]
    assert (runner["episodes_done"], runner["episodes_expected"]) == (10, 10)


def test_a_missing_latency_reads_as_a_dash_without_a_unit(tmp_path: Path) -> None:
    from rich.console import Console

    snap = run_status.snapshot(_run_dir(tmp_path, trainer_rc=None), now=1000.0)
    snap["eval"] = {
        "evaluations": 0, "per_min": None, "in_flight": 0, "queued": 0, "p50_s": None, "by_status": {},
        "per_device": {}, "workers_ready": 1, "workers": 1,
    }  # fmt: skip
    console = Console(width=400, record=True)
    console.print(status.render(snap))
    text = console.export_text()
    assert "p50 -," in text and "p50 - s" not in text


def test_plot_run_on_a_dry_run_says_so_and_plots_its_rollout_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tools import plot_run

    run = tmp_path / "dry-run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "trainer.log").write_text("no slime here\n")
    summary = {
        "records": 4, "statuses": {"truncated": 2, "completed": 2}, "mean_reward": 0.25,
        "turns": [{"turn": 1, "episodes": 4, "evaluated": 4, "compiled": 3, "correct": 1, "mean_reward": 0.1},
                  {"turn": 2, "episodes": 3, "evaluated": 3, "compiled": 3, "correct": 2, "mean_reward": 0.3}],
    }  # fmt: skip
    (run / "rollout_step.json").write_text(json.dumps(summary))
    assert plot_run.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "is a dry run" in out and "reward.png" in out and "correct_rate.png" in out
    rows = plot_run.dry_run_rows(run)
    assert rows == {0: {"rollout/kernel/mean_return": 0.25, "rollout/kernel/turn0/correct_rate": 0.25,
                        "rollout/kernel/turn1/correct_rate": 2 / 3}}  # fmt: skip


def test_services_of_a_stopped_run_read_stopped_not_unreachable(tmp_path: Path) -> None:
    from rich.console import Console

    def shown(run: Path) -> str:
        console = Console(width=400, record=True)
        console.print(status.render(run_status.snapshot(run, now=1000.0)))
        return console.export_text()

    running = _run_dir(tmp_path / "a")
    assert re.search(r"eval[\s│]+unreachable", shown(running))
    stopped = _run_dir(tmp_path / "b")
    (stopped / "stopped").write_text("2026-11-28T10:00:00Z\n")  # what scripts/stop.sh writes
    assert re.search(r"eval[\s│]+stopped \(the run was stopped at 2026-11-28T10:00:00Z\)", shown(stopped))
    ended = _run_dir(tmp_path / "c")
    (ended / "pids" / "eval.rc").write_text("1\n")
    assert re.search(r"eval[\s│]+stopped \(its window exited with code 1\)", shown(ended))


def test_status_and_plots_show_why_candidates_fail(tmp_path: Path) -> None:
    from rich.console import Console

    snap = run_status.snapshot(_run_dir(tmp_path), now=1000.0)
    snap["rollout"] = {
        "rollout/kernel/turn0/n": 8.0, "rollout/kernel/status/ok": 0.25, "rollout/kernel/status/compile_error": 0.5,
        "rollout/kernel/status/rejected": 0.25, "rollout/kernel/check/static.forbidden_api": 0.25,
    }  # fmt: skip
    console = Console(width=300, record=True)
    console.print(status.render(snap))
    text = console.export_text()
    assert "statuses: compile_error 0.5, ok 0.25, rejected 0.25" in text
    assert "ended by: static.forbidden_api 0.25" in text
    rows = {3: snap["rollout"]}
    assert [label for label, _ in run_curve_series("statuses", rows)] == ["compile_error", "ok", "rejected"]
    assert [label for label, _ in run_curve_series("checks", rows)] == ["static.forbidden_api"]
