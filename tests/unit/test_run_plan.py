"""tools/run_plan.py: the one GPU split rule, as the launchers and preflight use it."""

from __future__ import annotations

import pytest

from tools.run_plan import PlanError, main, plan_gpus, visible_ids

pytestmark = pytest.mark.unit

BASE = {"TRAIN_GPUS": "4", "ROLLOUT_GPUS": "2", "EVAL_GPUS": "2", "ROLLOUT_GPUS_PER_ENGINE": "1",
        "COLOCATE": "0", "TP": "2", "CP": "2", "PP": "1"}  # fmt: skip


def test_default_split_gives_ray_the_first_gpus_and_eval_the_last() -> None:
    plan = plan_gpus(BASE, list(range(8)))
    assert (plan.ray_num_gpus, plan.ray_devices, plan.eval_devices) == (6, "0,1,2,3,4,5", "6,7")


def test_ids_come_from_the_visible_list() -> None:
    ids = visible_ids({"CUDA_VISIBLE_DEVICES": "8,9,10,11,12,13,14,15"})
    plan = plan_gpus(BASE, ids)
    assert plan.ray_devices == "8,9,10,11,12,13" and plan.eval_devices == "14,15"
    with pytest.raises(PlanError, match="does not take UUIDs"):
        visible_ids({"CUDA_VISIBLE_DEVICES": "GPU-abc"})


def test_colocate_and_train_only_need_fewer_gpus() -> None:
    colocated = plan_gpus({**BASE, "COLOCATE": "1"}, list(range(6)))
    assert (colocated.ray_num_gpus, colocated.rollout, colocated.eval_devices) == (4, 4, "4,5")
    train_only = plan_gpus({**BASE, "TRAIN_ONLY": "1"}, list(range(6)))
    assert (train_only.rollout, train_only.ray_num_gpus, train_only.eval_devices) == (0, 4, "4,5")


def test_named_eval_devices_take_no_gpu_and_a_replaced_trainer_none() -> None:
    plan = plan_gpus({**BASE, "EVAL_DEVICES": "cpu"}, list(range(6)))
    assert plan.need == 6 and plan.eval_devices == "cpu"
    dry = plan_gpus({**BASE, "EVAL_DEVICES": "cpu", "TRAINER_CMD": "true"}, [])
    assert dry.need == 0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"TRAIN_GPUS": "3"}, "not a multiple of TP\\*CP\\*PP=4"),
        ({"ROLLOUT_GPUS": "3", "ROLLOUT_GPUS_PER_ENGINE": "2"}, "not a multiple of ROLLOUT_GPUS_PER_ENGINE"),
        ({"EVAL_GPUS": "x"}, "EVAL_GPUS=x: must be a non-negative integer"),
        ({"EVAL_GPUS": "0"}, "set EVAL_DEVICES"),
    ],
)
def test_bad_settings_name_what_to_change(change: dict[str, str], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_gpus({**BASE, **change}, list(range(8)))


def test_too_few_gpus_is_refused_unless_only_printing() -> None:
    with pytest.raises(PlanError, match="needs 8 GPUs .* but 6 are visible"):
        plan_gpus(BASE, list(range(6)))
    assumed = plan_gpus({**BASE, "PRINT_ONLY": "1"}, [0])
    assert assumed.assumed and assumed.eval_devices == "6,7"
    with pytest.raises(PlanError):  # a declared count is checked even when printing
        plan_gpus({**BASE, "PRINT_ONLY": "1", "NUM_GPUS": "1"}, [0])


def test_sft_uses_the_training_gpus_only() -> None:
    plan = plan_gpus({"TRAIN_GPUS": "2", "TP": "1", "CP": "1", "PP": "1"}, [3, 4, 5], kind="sft")
    assert plan.shell() == {"RAY_NUM_GPUS": "2", "RAY_VISIBLE_DEVICES": "3,4"}


def test_shell_output_is_what_bash_evaluates(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in {**BASE, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}.items():
        monkeypatch.setenv(key, value)
    assert main(["--shell"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "EVAL_DEVICES=6,7" in lines and "RAY_VISIBLE_DEVICES=0,1,2,3,4,5" in lines
    monkeypatch.setenv("TRAIN_GPUS", "3")
    assert main(["--shell"]) == 1
    assert "error: TRAIN_GPUS=3" in capsys.readouterr().err


PORTS = {"EVAL_PORT": "18188", "BUFFER_PORT": "8889", "ENGINE_PORT": "30010", "ROUTER_PORT": "30000",
         "RAY_PORT": "6379", "RAY_DASHBOARD_PORT": "8265", "RAY_CLIENT_PORT": "10001", "RAY_AGENT_PORT": "52365"}  # fmt: skip


def test_endpoints_follow_the_router_the_engine_or_a_url_given_by_hand() -> None:
    from tools.run_plan import plan_endpoints

    router = plan_endpoints({**PORTS, "ROUTER_HOST": "10.0.0.5"})
    assert router.sglang_url == "http://10.0.0.5:30000" and router.slime_host_ip == "10.0.0.5"
    assert router.eval_url == "http://127.0.0.1:18188" and router.buffer_url == "http://127.0.0.1:8889"
    assert router.ports == (18188, 8889, 6379, 8265, 10001, 52365, 30000)
    assert plan_endpoints({**PORTS, "ROUTER_HOST": "fd00::5"}).sglang_url == "http://[fd00::5]:30000"
    tiny = plan_endpoints({**PORTS, "ENGINE": "tiny", "TRAIN_ONLY": "1"})
    assert tiny.sglang_url == "http://127.0.0.1:30010" and tiny.engine_health_url.endswith(":30010/health")
    assert 30010 in tiny.ports and 30000 not in tiny.ports  # no router with TRAIN_ONLY
    dry = plan_endpoints({**PORTS, "SGLANG_URL": "http://e:1", "TRAINER_CMD": "true", "MODE": "in_slime"})
    assert dry.sglang_url == "http://e:1" and dry.ports == (18188,)


def test_endpoints_refuse_what_slime_would_get_wrong() -> None:
    from tools.run_plan import plan_endpoints

    with pytest.raises(PlanError, match="TRAIN_ONLY=1 starts no SGLang router"):
        plan_endpoints({**PORTS, "TRAIN_ONLY": "1"})
    with pytest.raises(PlanError, match="SLIME_HOST_IP=10.0.0.9 differs from ROUTER_HOST=10.0.0.5"):
        plan_endpoints({**PORTS, "ROUTER_HOST": "10.0.0.5", "SLIME_HOST_IP": "10.0.0.9"})
