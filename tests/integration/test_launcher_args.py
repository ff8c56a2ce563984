"""What the launchers would run (PRINT_ONLY=1: window scripts written and printed, nothing
started): slime argument groups, the GPU split and its overrides, colocated mode, resume from
the latest checkpoint, the run's recipe, the SFT run, the router address slime binds and the
runner calls, the in-slime mode, the single-GPU tiny preset; and the bad settings they refuse."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MODEL_ARGS = "MODEL_ARGS=(--num-layers 36 --hidden-size 4096 --swiglu)\n"


def _run(
    script: str, tmp_path: Path, cwd: Path = REPO, **extra: str | None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / script)],
        env=_env(tmp_path, **extra),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _env(tmp_path: Path, **extra: str | None) -> dict[str, str]:
    """A PRINT_ONLY launcher's environment: this test's model flags, recipe, run root and ports."""
    (tmp_path / "model.sh").write_text(MODEL_ARGS)
    (tmp_path / "recipe.yaml").write_text(
        "kernel_rl:\n  runner:\n    temperature: 0.7\n  episode:\n    max_turns: 2\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    env.update(
        PRINT_ONLY="1",
        PYTHON=sys.executable,
        TMUX_SOCKET=str(tmp_path / "tmux.sock"),
        RUNS_ROOT=str(tmp_path / "runs"),
        RUN_NAME="r",
        MODEL_ARGS_FILE=str(tmp_path / "model.sh"),
        RECIPE=str(tmp_path / "recipe.yaml"),
        CKPT_ROOT=str(tmp_path / "ckpt"),
        # Ports of this test only: the real defaults may be taken on a shared machine.
        EVAL_PORT="0",
        BUFFER_PORT="0",
        ROUTER_PORT="0",
        RAY_PORT="0",
        RAY_DASHBOARD_PORT="0",
        ENGINE_PORT="0",
    )
    env.pop("SLIME_HOST_IP", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the caller's GPUs are not the test's
    env.update(extra)
    for name in [k for k, v in extra.items() if v is None]:  # None: leave the setting unset
        env.pop(name)
    return env


def _argv(run_dir: Path, window: str) -> list[str]:
    line = [x for x in (run_dir / "cmd" / f"{window}.sh").read_text().splitlines() if x.startswith("exec ")][
        0
    ]
    return shlex.split(line)[1:]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_default_split_of_eight_gpus(tmp_path: Path) -> None:
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8")
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    trainer = _argv(run, "trainer")
    assert trainer[:3] == ["bash", str(REPO / "scripts/lib/ray_train.sh"), "train.py"]
    assert trainer[3:6] == ["--num-layers", "36", "--hidden-size"]  # MODEL_ARGS first
    assert (
        _flag(trainer, "--tensor-model-parallel-size") == "2"
        and _flag(trainer, "--context-parallel-size") == "2"
    )
    assert _flag(trainer, "--actor-num-gpus-per-node") == "4" and _flag(trainer, "--rollout-num-gpus") == "2"
    assert "--colocate" not in trainer
    assert "--override-opt_param-scheduler" in trainer  # a resumed run takes this launch's LR schedule
    assert _flag(trainer, "--rollout-temperature") == "0.7"  # from the recipe: one source
    assert _flag(trainer, "--rollout-function-path") == "slime_ext.slime_plugins.rollout.generate_rollout"
    assert _flag(trainer, "--custom-config-path") == str(run / "recipe.yaml")
    assert (
        _flag(trainer, "--custom-reward-post-process-path")
        == "slime_ext.slime_plugins.reward_post.post_process"
    )
    assert trainer[trainer.index("--eval-prompt-data") + 1 : trainer.index("--eval-prompt-data") + 3] == [
        "kernelbench_holdout",
        str(REPO / "data" / "kernelbench.jsonl"),
    ]
    assert _flag(trainer, "--load") == str(run / "checkpoints") and _flag(trainer, "--save") == str(
        run / "checkpoints"
    )
    assert _flag(trainer, "--ref-load") == str(tmp_path / "ckpt" / "Qwen3-8B_torch_dist")
    # KL_LOSS_COEF 0 (the default): no KL loss, so slime loads no reference model into the trainers
    assert "--use-kl-loss" not in trainer and "--kl-loss-coef" not in trainer
    trainer_script = (run / "cmd" / "trainer.sh").read_text()
    assert (
        "export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5" in trainer_script
        and "export RAY_NUM_GPUS=6" in trainer_script
    )
    ev = _argv(run, "eval")
    assert ev[1:3] == ["-m", "eval_server"] and _flag(ev, "--devices") == "6,7"
    # no CUDA_VISIBLE_DEVICES here: none from the tmux server either (another run may have set it)
    assert "unset CUDA_VISIBLE_DEVICES" in (run / "cmd" / "buffer.sh").read_text().splitlines()
    buf = _argv(run, "buffer")
    assert _flag(buf, "--recipe") == str(run / "recipe.yaml") and _flag(buf, "--group-size") == "8"
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]
    assert recipe["episode"] == {"max_turns": 2}
    assert recipe["runner"]["temperature"] == 0.7 and recipe["services"]["eval_urls"] == [
        "http://127.0.0.1:0"
    ]
    assert recipe["services"]["buffer_url"] == "http://127.0.0.1:0"
    # each service once: the runner and the plug-ins read `services` (slime_ext/rollout/recipe.py)
    assert not {"sglang_url", "eval_urls", "prompt_data", "tokenizer"} & set(recipe["runner"])
    assert not {"sglang_url", "eval_urls", "prompt_data", "tokenizer", "buffer_url"} & set(recipe["plugins"])
    assert "no checkpoint in" in res.stderr
    assert "KRL_RUN_ID=" in (run / "run.env").read_text()


def test_async_training_runs_one_policy_version_behind(tmp_path: Path) -> None:
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", TRAIN_ENTRY="train_async.py")
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    assert _argv(run, "trainer")[2] == "train_async.py"
    assert (
        yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]["plugins"]["policy_version_lag"] == 1
    )
    refused = _run(
        "run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", TRAIN_ENTRY="train_async.py", COLOCATE="1"
    )
    assert refused.returncode == 1 and "cannot run with COLOCATE=1" in refused.stderr


def test_overrides_colocate_and_resume(tmp_path: Path) -> None:
    ckpt = tmp_path / "runs" / "r" / "checkpoints"
    (ckpt / "iter_0000040").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("40")
    res = _run(
        "run_kbench_multiturn.sh",
        tmp_path,
        NUM_GPUS="6",
        COLOCATE="1",
        TRAIN_GPUS="4",
        EVAL_GPUS="2",
        ROLLOUT_TEMPERATURE="0.9",
        N_SAMPLES_PER_PROMPT="4",
        KL_LOSS_COEF="1e-3",
    )
    assert res.returncode == 0, res.stderr
    assert f"resuming from {ckpt} iteration 40" in res.stderr
    run = tmp_path / "runs" / "r"
    trainer = _argv(run, "trainer")
    assert trainer[2] == "train.py" and "--colocate" in trainer
    assert _flag(trainer, "--rollout-num-gpus") == "4" and _flag(trainer, "--rollout-temperature") == "0.9"
    assert "--use-kl-loss" in trainer and _flag(trainer, "--kl-loss-coef") == "1e-3"
    assert _flag(trainer, "--n-samples-per-prompt") == "4" and _flag(trainer, "--global-batch-size") == str(
        32 * 4
    )
    assert _flag(_argv(run, "eval"), "--devices") == "4,5"
    assert yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]["runner"]["temperature"] == 0.9


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"NUM_GPUS": "4"}, "needs 8 GPUs"),
        ({"NUM_GPUS": "8", "TRAIN_GPUS": "3"}, "not a multiple of TP*CP*PP=4"),
        ({"NUM_GPUS": "8", "MODEL_ARGS_FILE": "/nonexistent/model.sh"}, "model args not found"),
        ({"NUM_GPUS": "8", "RECIPE": "/nonexistent/recipe.yaml"}, "recipe not found"),
        ({"NUM_GPUS": "8", "MODE": "bogus"}, "use MODE=buffer or MODE=in_slime"),
        ({"NUM_GPUS": "8", "LR_SCHEDULE_ON_RESUME": "bogus"}, "use args, checkpoint or strict"),
        ({"NUM_GPUS": "8", "KL_LOSS_COEF": "-0.1"}, "KL_LOSS_COEF=-0.1: use a non-negative number"),
        ({"NUM_GPUS": "8", "ENGINE": "sglang"}, "use ENGINE=tiny"),
        ({"NUM_GPUS": "8", "TRAIN_ONLY": "1", "MODE": "in_slime"}, "TRAIN_ONLY=1 needs MODE=buffer"),
        ({"NUM_GPUS": "8", "TRAIN_ONLY": "1", "COLOCATE": "1"}, "nothing to colocate"),
        ({"NUM_GPUS": "8", "TRAIN_ONLY": "1"}, "set ENGINE=tiny"),
        ({"PRESET": "nope"}, "unknown PRESET=nope: configs/run/presets/ has single_gpu_tiny.sh"),
        (
            {"NUM_GPUS": "8", "SLIME_HOST_IP": "10.0.0.1", "ROUTER_HOST": "10.0.0.2"},
            "SLIME_HOST_IP=10.0.0.1 differs from ROUTER_HOST=10.0.0.2",
        ),
    ],
)
def test_bad_settings_are_refused_with_the_reason(
    tmp_path: Path, extra: dict[str, str], message: str
) -> None:
    res = _run("run_kbench_multiturn.sh", tmp_path, **extra)
    assert res.returncode == 1 and message in res.stderr
    assert (
        res.stderr.strip().splitlines()[-1].startswith("[")
        and "ERROR: " in res.stderr.strip().splitlines()[-1]
    )
    assert not (tmp_path / "runs" / "r" / "cmd").exists()


def test_bad_recipe_value_is_refused(tmp_path: Path) -> None:
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", CREDIT="bogus")
    assert res.returncode == 1 and "credit must be one of" in res.stderr
    assert not (tmp_path / "runs" / "r" / "cmd" / "trainer.sh").exists()


def test_seed_reaches_slime_and_the_runner_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    """SEED (the replicate of an A/B design, tools.ab_runs): slime's --seed and --rollout-seed and
    the agent runner's prompt order; unset, none of them is passed (their defaults hold)."""
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", SEED="7")
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    trainer = _argv(run, "trainer")
    assert _flag(trainer, "--seed") == "7" and _flag(trainer, "--rollout-seed") == "7"
    assert yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]["runner"]["shuffle_seed"] == 7
    (tmp_path / "plain").mkdir()
    (tmp_path / "bad").mkdir()
    res = _run("run_kbench_multiturn.sh", tmp_path / "plain", NUM_GPUS="8")
    assert res.returncode == 0, res.stderr
    plain = tmp_path / "plain" / "runs" / "r"
    assert "--seed" not in _argv(plain, "trainer") and "--rollout-seed" not in _argv(plain, "trainer")
    assert "shuffle_seed" not in yaml.safe_load((plain / "recipe.yaml").read_text())["kernel_rl"]["runner"]
    res = _run("run_kbench_multiturn.sh", tmp_path / "bad", NUM_GPUS="8", SEED="x1")
    assert res.returncode == 1 and "SEED=x1: use a non-negative integer" in res.stderr


def test_a_planned_ab_run_is_what_the_launcher_starts(tmp_path: Path) -> None:
    """tools.ab_runs' second run (arm trloo, seed 1, GPU 1, ports shifted) through the launcher:
    its name, seed, credit and eval port are the run's."""
    from tools import ab_runs

    runs = ab_runs.plan(
        "ab", [("grpo", {"CREDIT": "trajectory"}), ("trloo", {"CREDIT": "trloo"})], [1], ["0", "1"], 1
    )
    env = {k: v for k, v in runs[1].env.items() if not k.startswith("RAY_")}  # Ray's stay the test's
    res = _run("run_kbench_multiturn.sh", tmp_path, PRESET="single_gpu_tiny", NUM_GPUS="1", **env)
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "ab-trloo-s1"
    assert _flag(_argv(run, "trainer"), "--seed") == "1"
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]
    assert recipe["episode"]["reward"]["credit"] == "trloo"
    assert recipe["services"]["eval_urls"] == [f"http://127.0.0.1:{runs[1].env['EVAL_PORT']}"]
    assert _exported(run / "cmd" / "eval.sh", "CUDA_VISIBLE_DEVICES") == "1"


def test_ab_runs_launch_starts_every_planned_run(tmp_path: Path) -> None:
    """`tools.ab_runs --launch` calls the launcher once per (arm, seed) with the plan's settings
    (PRINT_ONLY: each writes its run's commands and returns), then names the comparison."""
    env = _env(tmp_path, PRESET="single_gpu_tiny", NUM_GPUS="1", RUN_NAME=None)
    for port in ("EVAL_PORT", "BUFFER_PORT", "ROUTER_PORT", "RAY_PORT", "RAY_DASHBOARD_PORT", "ENGINE_PORT"):
        env.pop(port)  # the plan's
    argv = [
        "--name",
        "ab",
        "--arm",
        "a:CREDIT=trajectory",
        "--arm",
        "b:CREDIT=trloo",
        "--seeds",
        "5",
        "--gpus",
        "0,1",
    ]
    res = subprocess.run(
        [sys.executable, "-m", "tools.ab_runs", *argv, "--launch"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    for arm, credit, gpu in (("a", "trajectory", "0"), ("b", "trloo", "1")):
        run = tmp_path / "runs" / f"ab-{arm}-s5"
        assert _flag(_argv(run, "trainer"), "--seed") == "5"
        assert (
            yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]["episode"]["reward"]["credit"]
            == credit
        )
        assert _exported(run / "cmd" / "eval.sh", "CUDA_VISIBLE_DEVICES") == gpu
    runs = tmp_path / "runs"
    assert f"tools.compare_training --a {runs}/ab-a-s5 --b {runs}/ab-b-s5 --labels a,b" in res.stdout


def test_backend_lands_in_the_run_recipe_and_is_printed(tmp_path: Path) -> None:
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8")
    assert res.returncode == 0, res.stderr
    assert "kernel backend: triton" in res.stderr  # the recipe's (default) backend
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", BACKEND="cuda")
    assert res.returncode == 0, res.stderr
    assert "kernel backend: cuda" in res.stderr
    recipe = yaml.safe_load((tmp_path / "runs" / "r" / "recipe.yaml").read_text())["kernel_rl"]
    assert recipe["episode"]["backend"] == "cuda" and recipe["episode"]["max_turns"] == 2
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", BACKEND="opencl")
    assert res.returncode == 1 and "unknown kernel backend 'opencl'" in res.stderr


def test_recipe_without_temperature_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r2.yaml").write_text("kernel_rl:\n  episode:\n    max_turns: 2\n")
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", RECIPE=str(tmp_path / "r2.yaml"))
    assert res.returncode == 1 and "runner.temperature" in res.stderr


def test_sft_run(tmp_path: Path) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    res = _run("run_sft.sh", tmp_path, SFT_DATA=str(data), TRAIN_GPUS="8", TP="4", CP="2")
    assert res.returncode == 0, res.stderr
    trainer = _argv(tmp_path / "runs" / "r", "trainer")
    assert trainer[2] == "train_async.py"
    assert _flag(trainer, "--rollout-function-path") == "slime.rollout.sft_rollout.generate_rollout"
    assert _flag(trainer, "--loss-type") == "sft_loss" and _flag(trainer, "--prompt-data") == str(data)
    assert (
        _flag(trainer, "--tensor-model-parallel-size") == "4"
        and _flag(trainer, "--context-parallel-size") == "2"
    )
    assert _flag(trainer, "--actor-num-gpus-per-node") == "8"
    missing = _run("run_sft.sh", tmp_path, SFT_DATA=str(tmp_path / "none.jsonl"))
    assert missing.returncode == 1 and "SFT data not found" in missing.stderr


def test_gpu_ids_follow_cuda_visible_devices(tmp_path: Path) -> None:
    """A run restricted with CUDA_VISIBLE_DEVICES (GPUs 8-15 of a node, or one GPU of two runs side
    by side) gives Ray, the eval server and SFT ids from that list, never a GPU it hid; ids that
    are not indices, or too few of them, are refused before anything starts."""
    big = _run("run_kbench_multiturn.sh", tmp_path, CUDA_VISIBLE_DEVICES="15,14,13,12,11,10,9,8")
    assert big.returncode == 0, big.stderr
    run = tmp_path / "runs" / "r"
    assert _exported(run / "cmd" / "trainer.sh", "CUDA_VISIBLE_DEVICES") == "15,14,13,12,11,10"
    assert _flag(_argv(run, "eval"), "--devices") == "9,8"
    (tmp_path / "one").mkdir()
    one = _run(
        "run_kbench_multiturn.sh", tmp_path / "one", PRESET="single_gpu_tiny", MODEL_ARGS_FILE="",
        CUDA_VISIBLE_DEVICES="1", RAY_CLIENT_PORT="0", RAY_AGENT_PORT="0",
    )  # fmt: skip
    assert one.returncode == 0, one.stderr
    script = tmp_path / "one" / "runs" / "r" / "cmd" / "trainer.sh"
    assert _exported(script, "CUDA_VISIBLE_DEVICES") == "1"
    assert _flag(_argv(tmp_path / "one" / "runs" / "r", "eval"), "--devices") == "1"  # beside training
    # every window sees the run's GPUs, not those of whoever started the tmux server
    assert _exported(tmp_path / "one" / "runs" / "r" / "cmd" / "buffer.sh", "CUDA_VISIBLE_DEVICES") == "1"
    assert (
        "unset CUDA_VISIBLE_DEVICES"
        not in (tmp_path / "one" / "runs" / "r" / "cmd" / "buffer.sh").read_text()
    )
    assert _exported(script, "RAY_CLIENT_PORT") == "0" and _exported(script, "RAY_AGENT_PORT") == "0"
    (tmp_path / "sft").mkdir()
    data = tmp_path / "sft.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    sft = _run("run_sft.sh", tmp_path / "sft", SFT_DATA=str(data), TRAIN_GPUS="2", TP="2", CP="1",
               CUDA_VISIBLE_DEVICES="6,7")  # fmt: skip
    assert sft.returncode == 0, sft.stderr
    assert _exported(tmp_path / "sft" / "runs" / "r" / "cmd" / "trainer.sh", "CUDA_VISIBLE_DEVICES") == "6,7"
    uuid = _run("run_kbench_multiturn.sh", tmp_path, CUDA_VISIBLE_DEVICES="GPU-1a2b")
    assert uuid.returncode == 1 and "list GPU indices" in uuid.stderr
    few = _run("run_kbench_multiturn.sh", tmp_path, CUDA_VISIBLE_DEVICES="0,1")
    assert few.returncode == 1 and "but 2 are visible" in few.stderr


def _fake_ray(tmp_path: Path) -> tuple[Path, Path]:
    """A TEST DOUBLE of the `ray` CLI (Ray and slime cannot run here): it only records its
    arguments. Returns (its bin directory, the calls file)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.jsonl"
    fake = bin_dir / "ray"
    fake.write_text(
        f"#!{sys.executable}\n# TEST DOUBLE of the ray CLI: records argv, does nothing.\n"
        f"import json, sys\nopen({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    fake.chmod(0o755)
    return bin_dir, calls


def _ray_calls(calls: Path) -> tuple[list[str], list[str]]:
    start, submit = [json.loads(line) for line in calls.read_text().splitlines()]
    return start, submit


def test_ray_train_command_line(tmp_path: Path) -> None:
    """scripts/lib/ray_train.sh with the `ray` TEST DOUBLE on PATH: what the trainer window would
    run: a Ray head on this run's ports and temp dir, then the slime job with Megatron-LM and
    this repository on PYTHONPATH and the run id and slime's host address in its environment."""
    bin_dir, calls = _fake_ray(tmp_path)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "MASTER_ADDR": "127.0.0.1",
        "RAY_PORT": "6390",
        "RAY_DASHBOARD_PORT": "8270",
        "RAY_CLIENT_PORT": "10011",
        "RAY_AGENT_PORT": "52375",
        "RAY_NUM_GPUS": "6",
        "RAY_TMPDIR": str(tmp_path / "ray"),
        "SLIME_DIR": str(tmp_path / "slime"),
        "MEGATRON_DIR": str(tmp_path / "megatron"),
        "KRL_REPO_ROOT": str(REPO),
        "KRL_RUN_ID": "run-1",
        "SLIME_HOST_IP": "10.1.2.3",
    }
    cmd = ["bash", str(REPO / "scripts/lib/ray_train.sh"), "train.py", "--lr", "1e-6", "--x", "a b"]
    missing = subprocess.run(
        cmd, env={k: v for k, v in env.items() if k != "SLIME_HOST_IP"}, capture_output=True, text=True
    )
    assert missing.returncode != 0 and "SLIME_HOST_IP" in missing.stderr
    assert not calls.exists()  # refused before a Ray head was started
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    start, submit = _ray_calls(calls)
    assert start[:2] == ["start", "--head"]
    assert _flag(start, "--port") == "6390" and _flag(start, "--num-gpus") == "6"
    assert _flag(start, "--temp-dir") == str(tmp_path / "ray") and _flag(start, "--dashboard-port") == "8270"
    assert _flag(start, "--ray-client-server-port") == "10011"
    assert _flag(start, "--dashboard-agent-listen-port") == "52375"
    assert submit[:2] == ["job", "submit"] and _flag(submit, "--address") == "http://127.0.0.1:8270"
    runtime = json.loads(_flag(submit, "--runtime-env-json"))["env_vars"]
    assert runtime["PYTHONPATH"] == f"{tmp_path / 'megatron'}:{REPO}" and runtime["KRL_RUN_ID"] == "run-1"
    assert runtime["SLIME_HOST_IP"] == "10.1.2.3"
    assert submit[submit.index("--") + 1 :] == [
        "python3",
        str(tmp_path / "slime" / "train.py"),
        "--lr",
        "1e-6",
        "--x",
        "a b",
    ]
    # TRAINER_PYTHONPATH goes first, the caller's PYTHONPATH last (packages installed beside the
    # system ones reach slime's Ray workers).
    np1, site = tmp_path / "np1", tmp_path / "site"
    env.update(TRAINER_PYTHONPATH=str(np1), PYTHONPATH=str(site))
    calls.unlink()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    runtime = json.loads(_flag(_ray_calls(calls)[1], "--runtime-env-json"))["env_vars"]
    assert runtime["PYTHONPATH"] == f"{np1}:{tmp_path / 'megatron'}:{REPO}:{site}"


def test_eval_on_cpu_still_needs_the_ray_gpus(tmp_path: Path) -> None:
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="4", EVAL_DEVICES="cpu")
    assert res.returncode == 1 and "needs 6 GPUs" in res.stderr
    ok = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="6", EVAL_DEVICES="cpu")
    assert ok.returncode == 0, ok.stderr
    assert _flag(_argv(tmp_path / "runs" / "r", "eval"), "--devices") == "cpu"


# --------------------------------------------------------------------------- router address


def _exported(script: Path, name: str) -> str:
    """The value a window script exports for NAME (the last export: what the command sees)."""
    prefix = f"export {name}="
    line = [x for x in script.read_text().splitlines() if x.startswith(prefix)][-1]
    return shlex.split(line[len(prefix) :])[0]


def _node_ipv4() -> str:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return next((a for a in out if a.count(".") == 3 and a.replace(".", "").isdigit()), "127.0.0.1")


@pytest.mark.parametrize(
    ("extra", "host", "url_host"),
    [
        ({}, None, None),  # derived from the node's addresses
        ({"ROUTER_HOST": "10.9.8.7"}, "10.9.8.7", "10.9.8.7"),
        ({"SLIME_HOST_IP": "10.4.5.6"}, "10.4.5.6", "10.4.5.6"),  # the caller's slime setting is kept
        ({"ROUTER_HOST": "fd00::5"}, "fd00::5", "[fd00::5]"),
    ],
)
def test_router_address_is_chosen_once(
    tmp_path: Path, extra: dict[str, str], host: str | None, url_host: str | None
) -> None:
    """slime binds its router where get_host_info() says (SLIME_HOST_IP when set); the runner's
    URL and the plug-ins' URL use the same value, which the trainer window and the Ray job's
    runtime env both carry (the written trainer script is run with the `ray` TEST DOUBLE)."""
    bin_dir, calls = _fake_ray(tmp_path)
    res = _run(
        "run_kbench_multiturn.sh",
        tmp_path,
        NUM_GPUS="8",
        ROUTER_PORT="30123",
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        **extra,
    )
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    ip = _exported(run / "cmd" / "trainer.sh", "SLIME_HOST_IP")
    assert ip == (host or _node_ipv4())
    url = f"http://{url_host or ip}:30123"
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]
    assert recipe["services"]["sglang_url"] == url
    assert _flag(_argv(run, "trainer"), "--sglang-router-port") == "30123"

    job = subprocess.run(
        ["bash", str(run / "cmd" / "trainer.sh")], capture_output=True, text=True, timeout=60
    )
    assert job.returncode == 0, job.stderr
    _, submit = _ray_calls(calls)
    assert json.loads(_flag(submit, "--runtime-env-json"))["env_vars"]["SLIME_HOST_IP"] == ip
    assert _flag(submit, "--sglang-router-port") == "30123"


# --------------------------------------------------------------------------- in-slime mode


def _prompts(path: Path) -> Path:
    from eval_server.samples import load_problem
    from slime_ext.rollout.problems import PromptRecord, write_prompt_records

    write_prompt_records(
        path,
        [
            PromptRecord("kb_relu", 1, "relu", "relu", load_problem("relu"), split="train"),
            PromptRecord("kb_softmax", 1, "softmax", "softmax", load_problem("softmax"), split="holdout"),
            PromptRecord("kb_matmul", 1, "matmul", "matmul", load_problem("matmul"), split="train"),
        ],
    )
    return path


def _windows(stdout: str) -> list[str]:
    return [line.split()[2] for line in stdout.splitlines() if line.startswith("### window ")]


def test_in_slime_mode(tmp_path: Path) -> None:
    """MODE=in_slime: slime's default rollout calls our generate and RM; its data source reads the
    train records with the reference as prompt (no chat template) and instance_id as label; no
    buffer window; evaluation through the plug-ins' holdout path; the trainer command runs."""
    prompts = _prompts(tmp_path / "prompts.jsonl")
    bin_dir, calls = _fake_ray(tmp_path)
    res = _run(
        "run_kbench_multiturn.sh",
        tmp_path,
        cwd=tmp_path,  # the launcher's own tools come from this checkout, wherever it is started
        NUM_GPUS="8",
        MODE="in_slime",
        PROMPT_DATA=str(prompts),
        CREDIT="per_turn",
        PATH=f"{bin_dir}:{os.environ['PATH']}",
    )
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    assert _windows(res.stdout) == ["eval", "trainer", "status"]
    assert not (run / "cmd" / "buffer.sh").exists()
    trainer = _argv(run, "trainer")
    assert _flag(trainer, "--rollout-function-path") == "slime.rollout.sglang_rollout.generate_rollout"
    assert _flag(trainer, "--custom-generate-function-path") == "slime_ext.slime_plugins.generate.generate"
    assert _flag(trainer, "--custom-rm-path") == "slime_ext.slime_plugins.generate.reward"
    assert _flag(trainer, "--eval-function-path") == "slime_ext.slime_plugins.rollout.generate_rollout"
    assert (
        _flag(trainer, "--custom-reward-post-process-path")
        == "slime_ext.slime_plugins.reward_post.post_process"
    )
    assert _flag(trainer, "--input-key") == "reference" and _flag(trainer, "--label-key") == "instance_id"
    assert "--apply-chat-template" not in trainer
    assert trainer.count("--prompt-data") == 1
    train_file = Path(_flag(trainer, "--prompt-data"))
    assert train_file == run / "prompts_train.jsonl"
    rows = [json.loads(line) for line in train_file.read_text().splitlines()]
    assert [r["instance_id"] for r in rows] == ["kb_relu", "kb_matmul"]  # train split only, in order
    from eval_server.samples import load_problem

    assert rows[0]["reference"] == load_problem("relu")  # what slime hands generate as sample.prompt
    ev = trainer.index("--eval-prompt-data")
    assert trainer[ev + 1 : ev + 3] == ["kernelbench_holdout", str(prompts)]
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]
    assert recipe["episode"]["reward"]["credit"] == "per_turn"
    assert recipe["services"]["prompt_data"] == str(prompts)  # level lookup by the generate plug-in
    assert (
        recipe["services"]["sglang_url"]
        == f"http://{_exported(run / 'cmd' / 'trainer.sh', 'SLIME_HOST_IP')}:0"
    )

    job = subprocess.run(
        ["bash", str(run / "cmd" / "trainer.sh")], capture_output=True, text=True, timeout=60
    )
    assert job.returncode == 0, job.stderr
    _, submit = _ray_calls(calls)
    assert submit[submit.index("--") + 1 :][2:] == trainer[3:]  # the job runs train.py with these args


def test_in_slime_mode_needs_train_records(tmp_path: Path) -> None:
    from slime_ext.rollout.problems import PromptRecord, write_prompt_records

    only_holdout = tmp_path / "holdout.jsonl"
    write_prompt_records(
        only_holdout, [PromptRecord("a", 1, "a", "a", "class Model: pass\n", split="holdout")]
    )
    res = _run(
        "run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", MODE="in_slime", PROMPT_DATA=str(only_holdout)
    )
    assert res.returncode == 1 and "has no train record" in res.stderr
    assert "could not write the train split" in res.stderr.strip().splitlines()[-1]


# --------------------------------------------------------------------------- single-GPU preset


def test_single_gpu_tiny_preset_train_only(tmp_path: Path) -> None:
    """PRESET=single_gpu_tiny TRAIN_ONLY=1 prints every window on a machine without GPUs: the
    embedded engine on HF_CKPT, eval on GPU 0, buffer, and slime --debug-train-only on GPU 0 with
    the tiny model's flags, TP=CP=PP=1 (no sequence parallelism), small batches, KL to REF_LOAD."""
    res = _run(
        "run_kbench_multiturn.sh",
        tmp_path,
        PRESET="single_gpu_tiny",
        TRAIN_ONLY="1",
        MODEL_ARGS_FILE="",  # the preset's model: configs/models/qwen3-tiny.sh
        CREDIT="per_turn",
        ENGINE_ARGS="--torch-threads 2 --seed 7",
    )
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    assert _windows(res.stdout) == ["engine", "eval", "buffer", "trainer", "status"]
    hf = tmp_path / "ckpt" / "Qwen3-tiny"
    assert _argv(run, "engine")[1:] == [
        "-m",
        "slime_ext.dev_engine.engine",
        "--model",
        str(hf),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--torch-threads",
        "2",
        "--seed",
        "7",
    ]
    trainer = _argv(run, "trainer")
    tiny_args = subprocess.run(
        [
            "bash",
            "-c",
            'source "$1"; printf "%s\\n" "${MODEL_ARGS[@]}"',
            "_",
            str(REPO / "configs/models/qwen3-tiny.sh"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert trainer[3 : 3 + len(tiny_args)] == tiny_args and _flag(trainer, "--hidden-size") == "64"
    assert "--debug-train-only" in trainer and "--colocate" not in trainer
    assert "--sglang-router-port" not in trainer and "--sglang-mem-fraction-static" not in trainer
    assert "--sglang-attention-backend" not in trainer
    for flag in ("--tensor-model-parallel-size", "--context-parallel-size", "--pipeline-model-parallel-size"):
        assert _flag(trainer, flag) == "1"
    assert "--sequence-parallel" not in trainer
    assert _flag(trainer, "--actor-num-gpus-per-node") == "1" and _flag(trainer, "--rollout-num-gpus") == "0"
    assert _flag(trainer, "--rollout-batch-size") == "4" and _flag(trainer, "--n-samples-per-prompt") == "4"
    assert _flag(trainer, "--global-batch-size") == "16"
    assert _flag(trainer, "--num-rollout") == "3" and _flag(trainer, "--save-interval") == "3"
    assert _flag(trainer, "--rollout-max-response-len") == "2048"  # a bundled candidate fits
    assert _flag(trainer, "--rollout-max-context-len") == "8192"
    assert _flag(trainer, "--max-tokens-per-gpu") == "16384"
    assert _flag(trainer, "--lr") == "1e-4" and _flag(trainer, "--attention-backend") == "auto"
    assert "--no-gradient-accumulation-fusion" in trainer  # runs without apex too
    assert "--use-kl-loss" in trainer and float(_flag(trainer, "--kl-loss-coef")) > 0
    assert _flag(trainer, "--ref-load") == f"{hf}_torch_dist" and _flag(trainer, "--hf-checkpoint") == str(hf)
    assert "--eval-interval" not in trainer
    script = run / "cmd" / "trainer.sh"
    assert _exported(script, "CUDA_VISIBLE_DEVICES") == "0" and _exported(script, "RAY_NUM_GPUS") == "1"
    assert _flag(_argv(run, "eval"), "--devices") == "0"  # shares GPU 0
    buf = _argv(run, "buffer")
    assert "--no-drop-zero-variance" in buf and _flag(buf, "--group-size") == "4"
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]
    assert recipe["services"]["sglang_url"] == "http://127.0.0.1:0"
    assert recipe["episode"]["reward"]["credit"] == "per_turn"
    assert recipe["runner"]["max_new_tokens"] == recipe["episode"]["max_new_tokens_per_turn"] == 2048
    assert recipe["runner"]["max_context_tokens"] == 8192


def test_single_gpu_tiny_preset_colocated_and_overrides(tmp_path: Path) -> None:
    """Without TRAIN_ONLY the same preset colocates SGLang on GPU 0 (no engine window) with the
    hd64 size of the tiny model (head dim 64, which SGLang serves) and SGLang's triton attention
    backend; values the caller sets win over the preset's."""
    res = _run(
        "run_kbench_multiturn.sh",
        tmp_path,
        PRESET="single_gpu_tiny",
        MODEL_ARGS_FILE="",  # the preset's model: configs/models/qwen3-tiny-hd64.sh
        NUM_GPUS="1",
        N_SAMPLES_PER_PROMPT="2",
        RECIPE_SET="runner.concurrency=3",
    )
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    assert _windows(res.stdout) == ["eval", "buffer", "trainer", "status"]
    trainer = _argv(run, "trainer")
    assert "--colocate" in trainer and "--debug-train-only" not in trainer
    assert (
        _flag(trainer, "--rollout-num-gpus") == "1"
        and _flag(trainer, "--sglang-mem-fraction-static") == "0.4"
        and _flag(trainer, "--sglang-attention-backend") == "triton"
    )
    assert "--sglang-sampling-backend" not in trainer and "--sglang-disable-cuda-graph" not in trainer
    hf = tmp_path / "ckpt" / "Qwen3-tiny-hd64"
    assert _flag(trainer, "--hf-checkpoint") == str(hf) and _flag(trainer, "--ref-load") == f"{hf}_torch_dist"
    assert _flag(trainer, "--kv-channels") == "64" and _flag(trainer, "--hidden-size") == "256"
    assert _flag(trainer, "--attention-backend") == "auto"  # Megatron's, not SGLang's
    assert _flag(trainer, "--n-samples-per-prompt") == "2" and _flag(trainer, "--global-batch-size") == "8"
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]
    ip = _exported(run / "cmd" / "trainer.sh", "SLIME_HOST_IP")
    assert recipe["services"]["sglang_url"] == f"http://{ip}:0"  # slime's router
    assert recipe["runner"]["concurrency"] == 3 and recipe["episode"]["reward"]["credit"] == "trajectory"
    too_few = _run("run_kbench_multiturn.sh", tmp_path, PRESET="single_gpu_tiny", NUM_GPUS="0")
    assert too_few.returncode == 1 and "needs 1 GPUs" in too_few.stderr
    (tmp_path / "other").mkdir()
    other = _run(
        "run_kbench_multiturn.sh",
        tmp_path / "other",
        PRESET="single_gpu_tiny",
        MODEL_ARGS_FILE="",
        NUM_GPUS="1",
        MODEL="qwen3-tiny",
        HF_NAME="Qwen3-tiny",
        SGLANG_ATTENTION_BACKEND="",  # empty: no flag, SGLang chooses
        SGLANG_EXTRA_ARGS="--sglang-log-level debug",
    )
    assert other.returncode == 0, other.stderr
    trainer = _argv(tmp_path / "other" / "runs" / "r", "trainer")
    assert "--sglang-attention-backend" not in trainer and _flag(trainer, "--kv-channels") == "16"
    assert "--sglang-disable-cuda-graph" not in trainer and _flag(trainer, "--sglang-log-level") == "debug"
    assert _flag(trainer, "--hf-checkpoint") == str(tmp_path / "other" / "ckpt" / "Qwen3-tiny")


def test_print_only_works_on_any_machine(tmp_path: Path) -> None:
    """PRINT_ONLY=1 with one GPU visible (a fake nvidia-smi), the default ports taken by another
    server and no NUM_GPUS: it prints the windows, saying that the documented default split is
    assumed and the ports are not checked (a real start would refuse both)."""
    import socket

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "real").mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    with socket.socket() as eval_sock, socket.socket() as buffer_sock:
        eval_sock.bind(("127.0.0.1", 0))
        eval_sock.listen(1)
        buffer_sock.bind(("127.0.0.1", 0))
        buffer_sock.listen(1)
        eval_port, buffer_port = eval_sock.getsockname()[1], buffer_sock.getsockname()[1]
        res = _run(
            "run_kbench_multiturn.sh",
            tmp_path,
            PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            EVAL_PORT=str(eval_port),
            BUFFER_PORT=str(buffer_port),
        )
        refused = _run(
            "run_kbench_multiturn.sh",
            tmp_path / "real",
            PRINT_ONLY="0",
            NUM_GPUS="8",
            EVAL_PORT=str(eval_port),
            TRAINER_CMD="true",
        )
    assert res.returncode == 0, res.stderr
    assert (
        "1 GPU(s) visible; the GPU split is not checked: assuming the documented default split" in res.stderr
    )
    assert "train 4, rollout 2, eval 2 (6,7): 8 of 1 GPU(s) (assumed)" in res.stderr
    assert f"ports {eval_port} {buffer_port}" in res.stderr and "not checked" in res.stderr
    assert "### window trainer" in res.stdout
    assert refused.returncode != 0 and f"port {eval_port} is in use" in refused.stderr


def test_mismatch_rejection_wires_slimes_own_function(tmp_path: Path) -> None:
    """MISMATCH=mrs: slime's rollout-correction function (its examples' mis.py, loaded by slime's
    --custom-tis-function-path) with the settings it reads as top-level keys of the run recipe;
    a key the user's recipe sets wins. Where slime's source is here, the written settings go
    through its real compute_mis_weights: a sample whose trainer and rollout log-probs disagree
    is rejected (its mask zeroed), an agreeing one kept."""
    recipe_text = "rs_upper_bound: 1.5\nkernel_rl:\n  runner:\n    temperature: 0.7\n"
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", MISMATCH="mrs")
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    trainer = _argv(run, "trainer")
    assert "--use-tis" in trainer
    fn = _flag(trainer, "--custom-tis-function-path")
    assert fn == "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
    settings = yaml.safe_load((run / "recipe.yaml").read_text())
    assert settings["use_rs"] is True and settings["rs_level"] == "geometric"
    assert settings["rs_upper_bound"] == 1.01 and abs(settings["rs_lower_bound"] - 1 / 1.01) < 1e-6
    res = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8")  # off by default
    assert res.returncode == 0, res.stderr
    assert "--use-tis" not in _argv(run, "trainer") and "use_rs" not in yaml.safe_load(
        (run / "recipe.yaml").read_text()
    )
    (tmp_path / "user.yaml").write_text(recipe_text)
    res = _run(
        "run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", MISMATCH="mrs", RECIPE=str(tmp_path / "user.yaml")
    )
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load((run / "recipe.yaml").read_text())["rs_upper_bound"] == 1.5  # the user's value

    slime = REPO / "third_party" / "slime"
    if not (slime / "examples" / "train_infer_mismatch_helper" / "mis.py").is_file():
        pytest.skip("slime's source is not in third_party/slime (scripts/fetch_upstream.sh)")
    import importlib.util
    from types import SimpleNamespace

    import torch

    spec = importlib.util.spec_from_file_location(
        "slime_mis", slime / "examples/train_infer_mismatch_helper/mis.py"
    )
    mis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mis)
    args = SimpleNamespace(**{k: v for k, v in settings.items() if k != "kernel_rl"})
    rollout = [torch.full((6,), -1.0), torch.full((6,), -1.0)]
    train = [torch.full((6,), -1.001), torch.full((6,), -1.3)]  # agrees / disagrees (ratio exp(-0.3))
    masks = [torch.ones(6), torch.ones(6)]
    _, kept, _ = mis.compute_mis_weights(
        args, train_log_probs=train, rollout_log_probs=rollout, loss_masks=masks
    )
    assert kept[0].sum().item() == 6 and kept[1].sum().item() == 0


@pytest.mark.parametrize("script", ["run_kbench_multiturn.sh", "run_sft.sh"])
def test_print_only_of_an_unnamed_run_leaves_no_run_directory(tmp_path: Path, script: str) -> None:
    """Without RUN_NAME the run's name comes from the clock, new at every call: printing must not
    leave a runs/<name> directory each time (nor the runs/ it created)."""
    sft = tmp_path / "sft.jsonl"
    sft.write_text("{}\n")
    res = _run(script, tmp_path, RUN_NAME=None, NUM_GPUS="8", SFT_DATA=str(sft))
    assert res.returncode == 0, res.stderr
    assert "### window trainer" in res.stdout and "exec " in res.stdout
    assert not (tmp_path / "runs").exists()
    named = _run(script, tmp_path, NUM_GPUS="8", SFT_DATA=str(sft))  # a named run keeps what it printed
    assert named.returncode == 0 and (tmp_path / "runs" / "r" / "cmd" / "trainer.sh").is_file()


def test_eval_fleet_mode_places_evaluation_through_ray(tmp_path: Path) -> None:
    """EVAL_FLEET=N: the eval window keeps N Ray-placed eval servers, the runner finds them
    through the run's Ray head, which offers this node's eval GPUs as krl_eval (not Ray GPUs)."""
    res = _run(
        "run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", EVAL_FLEET="3", MASTER_ADDR="10.0.0.5",
        EVAL_TIMEOUT_S="60", EVAL_EXTRA_ARGS="--runner-read-only",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    run_id = next(
        line.split("=", 1)[1]
        for line in (run / "run.env").read_text().splitlines()
        if line.startswith("export KRL_RUN_ID=")
    )
    fleet = _argv(run, "eval")
    assert fleet[:4] == [sys.executable, "-m", "slime_ext.cluster.eval_fleet", "start"]
    assert _flag(fleet, "--run-id") == run_id and _flag(fleet, "--servers") == "3"
    assert _flag(fleet, "--devices") == "gpu" and _flag(fleet, "--address").startswith("127.0.0.1:")
    server_args = next(a for a in fleet if a.startswith("--server-args=")).split("=", 1)[1].split()
    # the run's eval settings reach every Ray-placed server (they were the head's window's alone)
    assert server_args == [
        "--workers-per-device", "1", "--timeout-s", "60", "--precision-policy", "fp32", "--runner-read-only"
    ]  # fmt: skip
    trainer_script = (run / "cmd" / "trainer.sh").read_text()
    assert (
        "export KRL_EVAL_GPU_IDS=6\\,7" in trainer_script or "export KRL_EVAL_GPU_IDS=6,7" in trainer_script
    )
    assert "krl_eval" in trainer_script and "KRL_RAY_EVAL_RESOURCES" in trainer_script
    runner = yaml.safe_load((run / "recipe.yaml").read_text())["kernel_rl"]
    assert runner["services"]["eval_urls"] == [] and runner["runner"]["eval_fleet"] == run_id
    assert "scripts/join_node.sh 10.0.0.5:" in res.stderr  # how other nodes join
    bad = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", EVAL_FLEET="3", MODE="in_slime")
    assert bad.returncode != 0 and "EVAL_FLEET needs MODE=buffer" in bad.stderr
    # a head that keeps its GPUs for slime: every eval server on the nodes that join
    head_only = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="6", EVAL_GPUS="0", EVAL_FLEET="8")
    assert head_only.returncode == 0, head_only.stderr
    assert "export KRL_RAY_EVAL_RESOURCES=''" in (run / "cmd" / "trainer.sh").read_text()
    no_eval = _run("run_kbench_multiturn.sh", tmp_path, NUM_GPUS="6", EVAL_GPUS="0")
    assert no_eval.returncode != 0 and "or EVAL_FLEET" in no_eval.stderr


def test_ray_head_offers_the_eval_fleet_resources(tmp_path: Path) -> None:
    bin_dir, calls = _fake_ray(tmp_path)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "MASTER_ADDR": "127.0.0.1", "RAY_PORT": "6390",
        "RAY_DASHBOARD_PORT": "8270", "RAY_CLIENT_PORT": "10011", "RAY_AGENT_PORT": "52375",
        "RAY_NUM_GPUS": "6", "RAY_TMPDIR": str(tmp_path / "ray"), "SLIME_DIR": str(tmp_path / "slime"),
        "MEGATRON_DIR": str(tmp_path / "megatron"), "KRL_REPO_ROOT": str(REPO), "KRL_RUN_ID": "run-1",
        "SLIME_HOST_IP": "10.1.2.3", "KRL_RAY_EVAL_RESOURCES": '{"krl_eval": 2}',
    }  # fmt: skip
    res = subprocess.run(
        ["bash", str(REPO / "scripts/lib/ray_train.sh"), "train.py"], env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    start, _ = _ray_calls(calls)
    assert json.loads(_flag(start, "--resources")) == {"krl_eval": 2} and _flag(start, "--num-gpus") == "6"


def test_join_node_offers_eval_gpus_apart_from_slimes(tmp_path: Path) -> None:
    import socket

    head = socket.socket()
    head.bind(("127.0.0.1", 0))
    head.listen()
    address = f"127.0.0.1:{head.getsockname()[1]}"
    env = {**os.environ, "JOIN_PRINT_ONLY": "1", "PYTHON": sys.executable}
    join = REPO / "scripts" / "join_node.sh"
    try:
        res = subprocess.run(
            ["bash", str(join), address, "run-1", "--eval-gpus", "0,1,2", "--gpus", "4"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        argv = shlex.split(res.stdout.strip())
        assert argv[:2] == ["ray", "start"] and _flag(argv, "--address") == address
        assert _flag(argv, "--num-gpus") == "4" and json.loads(_flag(argv, "--resources")) == {"krl_eval": 3}
        for args, why in (
            ([address, "run-1"], "offer something"),
            ([address, "run 1", "--gpus", "1"], "RUN_ID"),
            ([address, "run-1", "--eval-gpus", "a"], "GPU ids"),
        ):
            bad = subprocess.run(
                ["bash", str(join), *args], env=env, capture_output=True, text=True, timeout=60
            )
            assert bad.returncode != 0 and why in bad.stderr, bad.stderr
    finally:
        head.close()
    gone = subprocess.run(
        ["bash", str(join), address, "run-1", "--gpus", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gone.returncode != 0 and "Ray head" in gone.stderr


def test_more_eval_server_flags_pass_through_as_words(tmp_path: Path) -> None:
    res = _run(
        "run_kbench_multiturn.sh", tmp_path, NUM_GPUS="8", EVAL_EXTRA_ARGS="--runner-read-only --reference-max-age 300"
    )
    assert res.returncode == 0, res.stderr
    ev = _argv(tmp_path / "runs" / "r", "eval")
    assert ev[-3:] == ["--runner-read-only", "--reference-max-age", "300"]
    assert _flag(ev, "--devices") == "6,7"
    from eval_server.__main__ import build_parser  # the words are the server's own flags

    parsed = build_parser().parse_args(ev[3:])
    assert parsed.runner_read_only and parsed.reference_max_age == 300
