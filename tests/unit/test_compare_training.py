"""tools.compare_training: seeded runs of two recipe choices, compared by their levels over the last
steps, paired by seed (slime_ext/reports/training_compare.py), from run directories with slime's
own log lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_ext.reports.training_compare import compare_training, run_level
from tools import compare_training as cli

pytestmark = pytest.mark.unit


def _run(root: Path, name: str, correct: list[float], step_s: float) -> Path:
    """A run directory whose trainer.log has slime's `step N:` and `perf N:` lines."""
    run = root / name
    (run / "logs").mkdir(parents=True)
    lines = []
    for i, c in enumerate(correct):
        lines.append(
            f"(MegatronTrainRayActor) model.py:918 - step {i}: {{'train/loss': -0.07, 'train/grad_norm': 0.2}}"
        )
        lines.append(
            f"(RolloutManager) rollout.py:268 - perf {i}: {{'rollout/kernel/correct_rate': {c}, 'perf/step_time': {step_s}}}"
        )
    (run / "logs" / "trainer.log").write_text("\n".join(lines) + "\n")
    return run


def test_a_run_level_is_the_mean_of_its_last_steps() -> None:
    rows = {i: {"m": float(v)} for i, v in enumerate([0, 0, 0, 3, 6, 9])}
    assert run_level(rows, "m", 0.5) == 6.0 and run_level(rows, "m", 1.0) == 3.0
    assert run_level(rows, "absent", 0.5) is None
    with pytest.raises(ValueError, match="last_share"):
        run_level(rows, "m", 0.0)


def test_arms_are_paired_by_seed_and_unequal_arms_refused() -> None:
    a = [{0: {"m": 0.1}, 1: {"m": 0.2}}, {0: {"m": 0.3}, 1: {"m": 0.4}}]
    b = [{0: {"m": 0.2}, 1: {"m": 0.5}}, {0: {"m": 0.3}, 1: {"m": 0.6}}]
    (c,) = compare_training(a, b, ["m"], last_share=0.5)
    assert c.levels_a == [0.2, 0.4] and c.levels_b == [0.5, 0.6]
    assert c.ci is not None and c.ci.n == 2 and c.ci.diff == pytest.approx(0.25)
    assert c.ci.low == pytest.approx(0.2) and c.ci.high == pytest.approx(0.3) and c.ci.p_b_better == 1.0
    with pytest.raises(ValueError, match="same number of runs"):
        compare_training(a, b[:1], ["m"])


def test_cli_reports_the_difference_with_its_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = [_run(tmp_path, f"grpo-s{s}", [0.2, 0.3, 0.4 + 0.05 * s], 30.0) for s in (1, 2)]
    b = [_run(tmp_path, f"trloo-s{s}", [0.2, 0.4, 0.6 + 0.05 * s], 31.0) for s in (1, 2)]
    out = tmp_path / "ab.md"
    argv = [
        "--a",
        ",".join(map(str, a)),
        "--b",
        ",".join(map(str, b)),
        "--labels",
        "grpo,trloo",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    text = out.read_text()
    assert "# trloo vs grpo: 2 seed(s) each" in text
    row = next(line for line in text.splitlines() if line.startswith("| rollout/kernel/correct_rate"))
    assert "| +0.2 | [+0.2, +0.2] | 1.00 | 2 |" in row  # the last third: one step of each run
    assert "| rollout/kernel/role/fixer/correct_rate | - | - | not logged in both arms |" in text
    assert cli.main(["--a", str(a[0]), "--b", ",".join(map(str, b))]) == 2
    assert cli.main(["--a", str(tmp_path / "nosuch"), "--b", str(b[0])]) == 2
    assert "not a run directory" in capsys.readouterr().err
