"""tools/preflight.py: each check passes on a good setup and fails, with a fix, on a broken one."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from krl_common.service import free_port
from slime_ext.rollout.problems import PromptRecord, write_prompt_records
from tools import preflight
from tools.preflight import FAIL, PASS, WARN

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
GOOD_ARGS = "MODEL_ARGS=(--num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --num-query-groups 2)\n"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF model directory as preflight sees it: config, a weight file, tokenizer files."""
    from slime_ext.dev_engine.tiny_model import tiny_tokenizer

    path = tmp_path_factory.mktemp("hf") / "tiny"
    tiny_tokenizer().save_pretrained(path)
    config = {
        "model_type": "qwen3",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": True,
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"")
    return path


def _torch_dist(path: Path, iteration: str = "release") -> Path:
    sub = path / ("release" if iteration == "release" else f"iter_{int(iteration):07d}")
    sub.mkdir(parents=True)
    (sub / ".metadata").write_bytes(b"x")
    (sub / "__0_0.distcp").write_bytes(b"x")
    (path / "latest_checkpointed_iteration.txt").write_text(iteration)
    return path


@pytest.fixture
def settings(tmp_path: Path, hf_dir: Path) -> dict[str, str]:
    args = tmp_path / "model.sh"
    args.write_text(GOOD_ARGS)
    prompts = tmp_path / "prompts.jsonl"
    write_prompt_records(prompts, [PromptRecord("p1", 1, "1_relu", "relu", "class Model: pass\n")])
    return {
        "SLIME_DIR": str(tmp_path / "slime"),
        "MEGATRON_DIR": str(tmp_path / "megatron"),
        "MODEL": "tiny",
        "MODEL_ARGS_FILE": str(args),
        "HF_CKPT": str(hf_dir),
        "REF_LOAD": str(_torch_dist(tmp_path / "ref")),
        "LOAD_DIR": str(tmp_path / "ckpt"),
        "SAVE_DIR": str(tmp_path / "ckpt"),
        "PROMPT_DATA": str(prompts),
        "RECIPE": str(REPO / "configs" / "dry_run" / "recipe.yaml"),
        "TRAIN_GPUS": "4",
        "ROLLOUT_GPUS": "2",
        "EVAL_GPUS": "2",
        "COLOCATE": "0",
        "TP": "2",
        "CP": "2",
        "PP": "1",
        "ROLLOUT_GPUS_PER_ENGINE": "1",
        "EVAL_PORT": "0",
        "BUFFER_PORT": "0",
        "ROUTER_PORT": "0",
        "RAY_PORT": "0",
        "RAY_DASHBOARD_PORT": "0",
        "RAY_CLIENT_PORT": "0",
        "RAY_AGENT_PORT": "0",
        "WANDB_PROJECT": "",
        "RUN_DIR": str(tmp_path / "run"),
        "RUN_NAMED": "1",
    }


def _by_name(checks: list[preflight.Check]) -> dict[str, preflight.Check]:
    return {c.name: c for c in checks}


def test_good_setup_passes_checkpoint_data_model_and_split(settings: dict[str, str]) -> None:
    checks = _by_name(preflight.run_checks(settings, env={}, gpus=lambda: 8))
    for name in (
        "hf checkpoint",
        "tokenizer",
        "ref load",
        "load (resume)",
        "model args",
        "prompt data",
        "recipe",
        "gpu split",
        "ports",
        "wandb",
        "torch",
    ):
        assert checks[name].status == PASS, checks[name]
    assert checks["slime"].status == FAIL and "SLIME_DIR" in checks["slime"].fix
    assert "8 of 8 GPU(s)" in checks["gpu split"].detail


def test_failures_name_the_problem_and_the_fix(settings: dict[str, str], tmp_path: Path) -> None:
    Path(settings["MODEL_ARGS_FILE"]).write_text(GOOD_ARGS.replace("--num-layers 2", "--num-layers 36"))
    settings["REF_LOAD"] = str(tmp_path / "missing")
    (tmp_path / "bad.jsonl").write_text('{"instance_id": 3}\n')
    settings["PROMPT_DATA"] = str(tmp_path / "bad.jsonl")
    settings["COLOCATE"] = "0"
    settings["WANDB_PROJECT"] = "proj"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        settings["BUFFER_PORT"] = str(busy.getsockname()[1])
        checks = _by_name(
            preflight.run_checks(settings, env={"NETRC": str(tmp_path / "none")}, gpus=lambda: 4)
        )
    assert (
        checks["model args"].status == FAIL
        and "--num-layers 36 vs num_hidden_layers 2" in checks["model args"].detail
    )
    assert checks["ref load"].status == FAIL and "convert" in checks["ref load"].fix
    assert (
        checks["prompt data"].status == FAIL
        and "level: missing required field" in checks["prompt data"].detail
    )
    assert checks["gpu split"].status == FAIL and "needs 8 GPUs" in checks["gpu split"].detail and "4 are visible" in checks["gpu split"].detail
    assert "COLOCATE=1" in checks["gpu split"].fix
    assert (
        checks["ports"].status == FAIL and f"BUFFER_PORT={settings['BUFFER_PORT']}" in checks["ports"].detail
    )
    assert checks["wandb"].status == FAIL
    table = preflight.format_table(list(checks.values()))
    assert "fix: " in table and "failed" in table.splitlines()[-1]


def test_colocate_split_and_divisibility(settings: dict[str, str]) -> None:
    settings["COLOCATE"] = "1"
    assert preflight.check_gpus(settings, 6).status == PASS  # 4 train+rollout, 2 eval
    settings["TRAIN_GPUS"] = "3"
    check = preflight.check_gpus(settings, 8)
    assert check.status == FAIL and "multiple of TP*CP*PP" in check.detail


def test_torch_dist_layouts(tmp_path: Path) -> None:
    good = _torch_dist(tmp_path / "a", "20")
    assert preflight.check_torch_dist("load (resume)", str(good), required=False).detail.endswith(
        "resume from iteration 20, 1 shard(s)"
    )
    broken = tmp_path / "b"
    broken.mkdir()
    (broken / "latest_checkpointed_iteration.txt").write_text("7")
    check = preflight.check_torch_dist("ref load", str(broken), required=True)
    assert check.status == FAIL and "iter_0000007 is missing" in check.detail
    assert preflight.check_torch_dist("load (resume)", str(tmp_path / "none"), required=False).status == PASS


def test_settings_come_from_the_launcher_defaults(tmp_path: Path) -> None:
    s = preflight.launcher_settings(
        {"PATH": os.environ["PATH"], "CKPT_ROOT": str(tmp_path), "TRAIN_GPUS": "2"}
    )
    assert s["HF_CKPT"] == f"{tmp_path}/Qwen3-8B" and s["REF_LOAD"] == f"{tmp_path}/Qwen3-8B_torch_dist"
    assert (
        s["TRAIN_GPUS"] == "2"
        and s["SLIME_DIR"] == "/root/slime"
        and s["MEGATRON_DIR"] == "/root/Megatron-LM"
    )


def test_cli_writes_json_and_exits_1_on_failure(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_CKPT", str(tmp_path / "nothing"))
    out = tmp_path / "pf.json"
    assert preflight.main(["--json", str(out)]) == 1
    rows = json.loads(out.read_text())
    assert any(r["name"] == "hf checkpoint" and r["status"] == FAIL for r in rows)
    assert "hf checkpoint" in capsys.readouterr().out


def test_gate_is_silent_when_the_trainer_inputs_are_good_and_one_line_otherwise(
    settings: dict[str, str], tmp_path: Path
) -> None:
    assert preflight.gate_line(preflight.gate_checks(settings)) is None
    settings["REF_LOAD"] = str(tmp_path / "missing")
    settings["PROMPT_DATA"] = str(tmp_path / "none.jsonl")
    line = preflight.gate_line(preflight.gate_checks(settings))
    assert line is not None and "\n" not in line
    assert line.startswith(f"ref load: {tmp_path / 'missing'} not found -> fix: convert the HF model: ")
    assert f"--hf-dir {settings['HF_CKPT']} --out {tmp_path / 'missing'}" in line
    assert line.endswith("[1 more: scripts/preflight.sh lists them]")


def _trainer_sources(tmp_path: Path, monkeypatch) -> None:
    """slime's and Megatron-LM's source markers, and Ray 'installed' (not on this machine)."""
    (tmp_path / "slime").mkdir()
    (tmp_path / "slime" / "train.py").write_text("")
    (tmp_path / "mlm" / "megatron").mkdir(parents=True)
    monkeypatch.setenv("SLIME_DIR", str(tmp_path / "slime"))
    monkeypatch.setenv("MEGATRON_DIR", str(tmp_path / "mlm"))
    real = preflight._version
    monkeypatch.setattr(preflight, "_version", lambda dist: "2.60.0" if dist == "ray" else real(dist))


def test_gate_cli_and_an_unknown_preset(tmp_path: Path, monkeypatch, capsys) -> None:
    _trainer_sources(tmp_path, monkeypatch)
    monkeypatch.setenv("HF_CKPT", str(tmp_path / "nothing"))
    assert preflight.main(["--gate"]) == 1
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and out.startswith("hf checkpoint: ")
    monkeypatch.setenv("PRESET", "nope")
    assert preflight.main([]) == 1
    assert "unknown PRESET=nope" in capsys.readouterr().out


def test_preset_defaults_reach_the_settings(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "PRESET": "single_gpu_tiny", "CKPT_ROOT": str(tmp_path), "TP": "1"}
    s = preflight.launcher_settings(env)
    # SGLang generates: the hd64 size (head dim 64; SGLang cannot serve the default size's 16)
    assert s["HF_CKPT"] == f"{tmp_path}/Qwen3-tiny-hd64" and s["MODEL"] == "qwen3-tiny-hd64"
    assert s["TRAIN_GPUS"] == "1" and s["EVAL_GPUS"] == "0" and s["COLOCATE"] == "1"
    assert s["MODEL_ARGS_FILE"].endswith("configs/models/qwen3-tiny-hd64.sh")
    # TRAIN_ONLY=1: the embedded engine generates, with the default size
    s = preflight.launcher_settings({**env, "TRAIN_ONLY": "1"})
    assert s["HF_CKPT"] == f"{tmp_path}/Qwen3-tiny" and s["MODEL"] == "qwen3-tiny"
    assert s["MODEL_ARGS_FILE"].endswith("configs/models/qwen3-tiny.sh")


def test_one_wandb_row_off_passes_without_the_package(settings: dict[str, str], monkeypatch) -> None:
    """W&B off: one PASS row saying "off", and no separate "wandb not installed" warning."""
    real = preflight._version
    monkeypatch.setattr(preflight, "_version", lambda d: None if d == "wandb" else real(d))
    checks = preflight.run_checks(settings, env={}, gpus=lambda: 8)
    rows = [c for c in checks if "wandb" in c.name]
    assert len(rows) == 1 and rows[0].status == PASS and rows[0].detail.startswith("off")
    settings["WANDB_PROJECT"] = "proj"
    on = preflight.check_wandb(settings, {"WANDB_API_KEY": "k"})
    assert on.status == FAIL and on.fix == "pip install wandb"


def test_wandb_on_needs_credentials(settings: dict[str, str], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(preflight, "_version", lambda d: "0.19.0")
    settings["WANDB_PROJECT"] = "proj"
    none = {"NETRC": str(tmp_path / "none")}
    assert preflight.check_wandb(settings, none).status == FAIL
    assert preflight.check_wandb(settings, {**none, "WANDB_API_KEY": "k"}).status == PASS
    assert "offline" in preflight.check_wandb(settings, {**none, "WANDB_MODE": "offline"}).detail


def test_resume_row_checks_load_dir_only_for_a_named_run(settings: dict[str, str], tmp_path: Path) -> None:
    settings["LOAD_DIR"] = str(_torch_dist(tmp_path / "resume", "30"))
    assert "resume from iteration 30" in preflight.check_resume(settings).detail
    settings["RUN_NAMED"] = ""
    unnamed = preflight.check_resume(settings)
    assert unnamed.status == PASS and unnamed.detail.startswith("not checked: RUN_NAME is not set")
    assert str(tmp_path) not in unnamed.detail


def test_run_named_comes_from_the_callers_environment(tmp_path: Path) -> None:
    base = {"PATH": os.environ["PATH"], "CKPT_ROOT": str(tmp_path)}
    assert preflight.launcher_settings(base)["RUN_NAMED"] == ""
    named = preflight.launcher_settings({**base, "RUN_NAME": "exp1"})
    assert named["RUN_NAMED"] == "1" and named["LOAD_DIR"].endswith("/exp1/checkpoints")
    assert preflight.launcher_settings({**base, "LOAD_DIR": str(tmp_path)})["RUN_NAMED"] == "1"


def test_recipe_row_shows_the_kernel_backend_and_backend_overrides_it(settings: dict[str, str]) -> None:
    assert "backend triton," in preflight.check_recipe(settings).detail  # the dry-run recipe's default
    settings["BACKEND"] = "cuda"
    check = preflight.check_recipe(settings)
    assert check.status == PASS and "backend cuda," in check.detail
    settings["BACKEND"] = "opencl"
    check = preflight.check_recipe(settings)
    assert check.status == FAIL and "unknown kernel backend 'opencl'" in check.detail


def test_gate_names_a_missing_trainer_requirement_first(tmp_path: Path, monkeypatch, capsys) -> None:
    """The trainer's own requirements (slime's source, Megatron-LM's, Ray) come before its inputs:
    one line naming the first missing one and how to get it."""
    monkeypatch.setenv("SLIME_DIR", str(tmp_path / "no-slime"))
    monkeypatch.setenv("HF_CKPT", str(tmp_path / "nothing"))
    assert preflight.main(["--gate"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"slime: {tmp_path / 'no-slime'}/train.py not found -> fix: ")
    _trainer_sources(tmp_path, monkeypatch)
    monkeypatch.setattr(preflight, "_version", lambda dist: None)  # no Ray
    assert preflight.main(["--gate"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("ray: not installed -> fix: ")


def test_the_split_is_the_launchers_train_only_and_named_eval_devices_need_fewer(settings: dict[str, str]) -> None:
    """TRAIN_ONLY=1 starts no SGLang engine and EVAL_DEVICES=cpu takes no GPU: the launcher starts
    on 6 GPUs then, and preflight must agree (it said "needs 8 GPUs, 6 visible")."""
    settings.update(TRAIN_GPUS="4", ROLLOUT_GPUS="2", EVAL_GPUS="2", COLOCATE="0", TP="1", CP="1", PP="1")
    assert preflight.check_gpus(settings, 6).status == FAIL
    assert preflight.check_gpus({**settings, "TRAIN_ONLY": "1"}, 6).status == PASS
    check = preflight.check_gpus({**settings, "EVAL_DEVICES": "cpu"}, 6)
    assert check.status == PASS and "eval 2 (cpu)" in check.detail


def test_ports_are_the_plans_and_its_refusals_the_launchers(settings: dict[str, str]) -> None:
    ports = {n: str(free_port()) for n in ("EVAL_PORT", "BUFFER_PORT", "ENGINE_PORT", "ROUTER_PORT", "RAY_PORT",
                                           "RAY_DASHBOARD_PORT", "RAY_CLIENT_PORT", "RAY_AGENT_PORT")}  # fmt: skip
    settings.update(ports)
    check = preflight.check_ports({**settings, "TRAIN_ONLY": "1"})
    assert check.status == FAIL and "TRAIN_ONLY=1 starts no SGLang router" in check.detail
    tiny = preflight.check_ports({**settings, "TRAIN_ONLY": "1", "ENGINE": "tiny"})
    assert tiny.status == PASS and "ENGINE_PORT" in tiny.detail and "ROUTER_PORT" not in tiny.detail
    assert "ROUTER_PORT" in preflight.check_ports(settings).detail


def test_the_isolation_row_says_whether_candidates_get_read_only_file_systems() -> None:
    from eval_server.isolation.sandbox import confinement_refused

    here = preflight.check_isolation()  # this machine's real answer
    assert here.status == (PASS if not confinement_refused(["/tmp"]) else WARN)
    # a container that refuses user namespaces: a test double of the kernel's answer
    refused = preflight.check_isolation(lambda paths: "unshare(CLONE_NEWUSER | CLONE_NEWNS): Operation not permitted")
    assert refused.status == WARN and "Operation not permitted" in refused.detail
    assert "seccomp" in refused.fix
