"""tools.ab_runs: the plan of seeded A/B runs side by side (GPUs, ports, names, seeds, arm
settings), refused when it cannot fit; the ports' bases are the launcher's own defaults."""

from __future__ import annotations

import pytest

from tools import ab_runs

pytestmark = pytest.mark.unit

ARMS = [("grpo", {"CREDIT": "trajectory"}), ("trloo", {"CREDIT": "trloo", "KL_LOSS_COEF": "0.01"})]


def test_every_run_gets_its_own_gpus_ports_name_and_seed() -> None:
    runs = ab_runs.plan("ab", ARMS, [1, 2], [str(g) for g in range(8)], 2)
    assert [(r.arm, r.seed) for r in runs] == [("grpo", 1), ("trloo", 1), ("grpo", 2), ("trloo", 2)]
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in runs] == ["0,1", "2,3", "4,5", "6,7"]
    assert [r.run_name for r in runs] == ["ab-grpo-s1", "ab-trloo-s1", "ab-grpo-s2", "ab-trloo-s2"]
    assert all(r.env["TMUX_SESSION"] == r.run_name and r.env["SEED"] == str(r.seed) for r in runs)
    for port in ab_runs.PORTS:  # no two runs share a port, and none is in Ray's worker range
        values = [int(r.env[port]) for r in runs]
        assert len(set(values)) == len(values)
    every = [int(r.env[p]) for r in runs for p in ab_runs.PORTS]
    assert len(set(every)) == len(every)
    assert all(not 10002 <= int(r.env["RAY_CLIENT_PORT"]) <= 19999 for r in runs)
    assert runs[1].env["CREDIT"] == "trloo" and runs[1].env["KL_LOSS_COEF"] == "0.01"
    assert "KL_LOSS_COEF" not in runs[0].env
    assert runs[0].shell_line().endswith(" scripts/run_kbench_multiturn.sh")
    cmd = ab_runs.compare_command(runs, "R")
    assert (
        cmd
        == "python -m tools.compare_training --a R/ab-grpo-s1,R/ab-grpo-s2 --b R/ab-trloo-s1,R/ab-trloo-s2 --labels grpo,trloo"
    )


def test_the_port_bases_are_the_launchers_defaults() -> None:
    ports = ab_runs.default_ports()
    assert (
        set(ports) == set(ab_runs.PORTS) and ports["EVAL_PORT"] == 18188 and ports["RAY_CLIENT_PORT"] == 10001
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ab", ARMS, [1, 2], ["0", "1", "2"], 1), "need 4 GPUs, --gpus has 3"),
        (("ab", ARMS, [1, 1], ["0", "1", "2", "3"], 1), "no repeats"),
        (("ab", [ARMS[0], ARMS[0]], [1], ["0", "1"], 1), "each with its own name"),
        (("ab", [("x", {"EVAL_PORT": "1"})], [1], ["0"], 1), "EVAL_PORT are set by the plan"),
        (("a b", ARMS, [1], ["0", "1"], 1), "--name"),
    ],
)
def test_a_plan_that_cannot_work_is_refused(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ab_runs.plan(*args)


def test_arm_syntax_and_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert ab_runs.parse_arm("trloo:CREDIT=trloo,RECIPE_SET=a=1") == (
        "trloo",
        {"CREDIT": "trloo", "RECIPE_SET": "a=1"},
    )
    with pytest.raises(ValueError, match="not VAR=VALUE"):
        ab_runs.parse_arm("x:credit=trloo")
    argv = ["--name", "c", "--arm", "grpo:CREDIT=trajectory", "--arm", "trloo:CREDIT=trloo", "--gpus", "0,1"]
    assert ab_runs.main([*argv, "--seeds", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CUDA_VISIBLE_DEVICES=0 RUN_NAME=c-grpo-s3 ") and "SEED=3" in out[0]
    assert out[-1].startswith("python -m tools.compare_training --a ")
    assert ab_runs.main(argv) == 2  # two seeds x two arms on two GPUs
    assert "need 4 GPUs" in capsys.readouterr().err
