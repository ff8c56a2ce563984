"""The buffer-mode rollout function (slime_ext/slime_plugins/rollout.py) against the REAL buffer
server process on loopback: whole groups, ack after conversion, policy version reported, long-poll
for late groups, lease released when a group cannot be used, per_turn fan-out, timeouts.
slime is the labelled TEST DOUBLE in tests/slime_double; records are fed through POST
/trajectories (as the agent runner writes them)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from tests.slime_double import install

install()

from slime.observability.rollout_data_utils import validate_rollout_id_annotated  # noqa: E402
from slime.rollout.base_types import RolloutFnTrainOutput, call_rollout_fn  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

from krl_common.service import free_port, running_service  # noqa: E402
from slime_ext.slime_plugins.buffer_client import BufferError  # noqa: E402
from slime_ext.slime_plugins.rollout import POST_PROCESS_PATH, generate_rollout, reset_state  # noqa: E402
from slime_ext.slime_plugins.samples import TRAJECTORY_KEY, check_sample  # noqa: E402
from tests.trajectory_dicts import post_trajectories as post  # noqa: E402
from tests.trajectory_dicts import trajectory_dict as record  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One buffer server (groups of 2 records) for the module; every test drains what it writes."""
    tmp = tmp_path_factory.mktemp("buffer")
    args = ["--db", str(tmp / "b.sqlite"), "--group-size", "2", "--max-wait-s", "30"]
    with running_service("buffer_server", args, tmp, startup_timeout_s=60) as svc:
        yield svc.url
    reset_state()


_versions = itertools.count(10)


def next_rollout_id(url: str) -> int:
    """Policy versions only go up on one server: every step uses a fresh, larger rollout id, and
    the server is at that version before records of it are written (as with the real runner)."""
    rid = next(_versions)
    r = httpx.post(f"{url}/policy_version", json={"version": rid}, timeout=10)
    assert r.status_code == 200, r.text
    return rid


def args_for(
    url: str, *, batch: int, n: int, hook: bool = False, credit: str = "trajectory", **plugins
) -> object:
    return SimpleNamespace(
        rollout_batch_size=batch,
        n_samples_per_prompt=n,
        advantage_estimator="grpo",
        rewards_normalization=True,
        custom_reward_post_process_path=POST_PROCESS_PATH if hook else None,
        kernel_rl={
            "episode": {"reward": {"credit": credit}},
            "plugins": {
                "buffer_url": url,
                "start_runner": False,
                "batch_wait_s": 5,
                "max_wait_s": 30,
                **plugins,
            },
        },
    )


def stats(url: str) -> dict:
    return httpx.get(f"{url}/stats", timeout=10).json()


def test_whole_groups_acked_and_policy_version_reported(url: str) -> None:
    rid = next_rollout_id(url)
    before = stats(url)["records"]["consumed"]
    post(url, [record(f"g{g}-{i}", f"g{g}", 0.1 * i, version=rid) for g in range(3) for i in range(2)])
    args = args_for(url, batch=2, n=2)
    out = call_rollout_fn(generate_rollout, args, rid, None, evaluation=False)
    assert isinstance(out, RolloutFnTrainOutput)
    assert [len(g) for g in out.samples] == [2, 2]
    validate_rollout_id_annotated(out.samples)
    for group in out.samples:
        assert {s.label for s in group} == {group[0].label}  # one instance per group
        assert len({s.group_index for s in group}) == 1
        for s in group:
            check_sample(s)
            assert s.status == Sample.Status.COMPLETED
            assert s.tokens[-s.response_length :] == s.tokens[3:] and s.loss_mask == [1, 1, 0, 0, 1]
    assert out.samples[0][0].group_index != out.samples[1][0].group_index
    assert sorted(s.reward for g in out.samples for s in g) == pytest.approx([0.0, 0.0, 0.1, 0.1])
    first_indices = {s.index for g in out.samples for s in g}
    assert len(first_indices) == 4
    st = stats(url)
    assert st["policy_version"] == rid
    assert st["records"]["consumed"] - before == 4 and st["records"]["leased"] == 0
    assert out.metrics["rollout/buffer/groups"] == 2 and out.metrics["rollout/buffer/policy_version"] == rid

    # next step: one group is ready, the other arrives while the rollout function long-polls
    rid2 = next_rollout_id(url)
    later = threading.Timer(
        1.0, post, (url, [record(f"h-{i}", "h", 0.5 * i, version=rid2) for i in range(2)])
    )
    later.start()
    started = time.monotonic()
    out2 = generate_rollout(args, rid2, None)
    later.join()
    assert time.monotonic() - started >= 0.9
    assert sorted(g[0].label for g in out2.samples) == ["g2", "h"]
    assert stats(url)["policy_version"] == rid2
    assert out2.metrics["rollout/buffer/staleness_max"] == rid2 - rid  # g2 was sampled with version rid
    # indices keep growing across steps (slime sorts and identifies samples by them)
    assert min(s.index for g in out2.samples for s in g) > max(first_indices)


def test_unusable_group_is_released_not_lost(url: str) -> None:
    before = stats(url)["records"]
    rid = next_rollout_id(url)
    post(url, [record(f"a-{i}", "a", float(i), version=rid) for i in range(2)])
    # slime's default normalisation needs n=3 samples per group; the group has 2
    with pytest.raises(ValueError, match="custom-reward-post-process-path"):
        generate_rollout(args_for(url, batch=1, n=3), rid, None)
    st = stats(url)["records"]
    assert st["leased"] == 0 and st["ready"] == 2 and st["consumed"] == before["consumed"]
    out = generate_rollout(args_for(url, batch=1, n=3, hook=True), rid, None)  # with the group-aware hook
    assert len(out.samples[0]) == 2 and stats(url)["records"]["consumed"] - before["consumed"] == 2
    # slime needs >= --global-batch-size rollouts (trajectories) per step: one more group is leased
    post(url, [record(f"b{g}-{i}", f"b{g}", float(i), version=rid) for g in range(2) for i in range(2)])
    args = args_for(url, batch=1, n=3, hook=True)
    args.global_batch_size = 3
    out = generate_rollout(args, rid, None)
    assert [len(g) for g in out.samples] == [2, 2] and out.metrics["rollout/buffer/trajectories"] == 4


def test_per_turn_records_fan_out(url: str) -> None:
    rid = next_rollout_id(url)

    def turn(ep: str, k: int, reward: float) -> dict:
        meta = {"level": 1, TRAJECTORY_KEY: ep}
        return record(f"{ep}-t{k}", "p", reward, version=rid, sample_index=k, metadata=meta)

    with pytest.raises(ValueError, match="per_turn credit fans out"):  # checked before leasing
        generate_rollout(args_for(url, batch=1, n=1, credit="per_turn"), rid, None)
    post(url, [turn("e1", 1, 0.3), turn("e1", 0, 0.22)])
    out = generate_rollout(args_for(url, batch=1, n=1, hook=True, credit="per_turn"), rid, None)
    ((traj,),) = out.samples  # one group, one trajectory, two turn samples
    validate_rollout_id_annotated(out.samples)
    assert [s.metadata["kernel_rl"]["turn"] for s in traj] == [0, 1]
    assert len({s.rollout_id for s in traj}) == 1 and len({s.index for s in traj}) == 1
    assert [s.reward for s in traj] == pytest.approx([0.22, 0.3])
    assert traj[1].tokens != traj[0].tokens


def test_runner_start_and_timeouts(url: str) -> None:
    # this buffer has no runner configured: the error says what to do
    with pytest.raises(BufferError, match="start the buffer server with --recipe") as err:
        generate_rollout(args_for(url, batch=1, n=2, start_runner=True), next_rollout_id(url), None)
    assert err.value.status_code in (409, 501)  # 409: no runner configured (501 before the runner landed)
    with pytest.raises(TimeoutError, match=r"0 of 1 groups \(0 of 0 trajectories\) after 1 s"):
        generate_rollout(
            args_for(url, batch=1, n=2, max_wait_s=1, batch_wait_s=0.5), next_rollout_id(url), None
        )
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BufferError, match="unreachable"):
        generate_rollout(args_for(dead, batch=1, n=2), 0, None)


def test_profiling_based_rejection_drops_lazy_trajectories(url: str) -> None:
    """PRS (kernel_rl.episode.reward.prs_min_share): a trajectory whose last evaluated turn is a
    correct kernel that spent too little of its GPU time in its own kernels is left out of the
    batch (acked, not handed back) and counted; without the setting nothing is dropped."""
    rid = next_rollout_id(url)

    def turn(share: float | None, correct: bool = True) -> list[dict]:
        kt = (
            None
            if share is None
            else {"own_share": share, "own_us": share * 10, "total_us": 10.0, "others": []}
        )
        status = "ok" if correct else "incorrect"
        return [{"status": status, "compiled": True, "correct": correct, "kernel_time": kt}]

    shares = [(0.9, True), (0.2, True), (None, True), (0.1, False)]  # lazy: only the second
    post(url, [record(f"prs-{i}", "prs", 0.1 * i, version=rid, turn_eval_results=turn(s, c))
               for i, (s, c) in enumerate(shares)])  # fmt: skip
    before = stats(url)["records"]["consumed"]
    args = args_for(url, batch=1, n=4, hook=True)
    args.kernel_rl["episode"]["reward"]["prs_min_share"] = 0.5
    out = generate_rollout(args, rid, None)
    assert sorted(s.reward for s in out.samples[0]) == pytest.approx([0.0, 0.2, 0.3])  # prs-1 left out
    assert out.metrics["rollout/buffer/prs_dropped"] == 1
    assert stats(url)["records"]["consumed"] - before == 4  # the dropped one is consumed, not returned
    # the same group without the setting: all four trained, nothing counted
    post(url, [record(f"prs2-{i}", "prs2", 0.1 * i, version=rid, turn_eval_results=turn(s, c))
               for i, (s, c) in enumerate(shares)])  # fmt: skip
    out = generate_rollout(args_for(url, batch=1, n=4, hook=True), rid, None)
    assert len(out.samples[0]) == 4 and out.metrics["rollout/buffer/prs_dropped"] == 0


def test_a_resumed_non_colocated_run_reloads_the_engines_before_its_first_rollout(url: str, tmp_path) -> None:
    """slime's non-colocated push sends the reference model when a run resumes with KL loss
    (slime_ext.slime_plugins.resume_weights): the first rollout of the process has every worker
    load the resumed checkpoint (the SGLang double of tests/integration/test_resume_weights.py),
    says so in its metrics, and later rollouts do not reload."""
    from slime_ext.convert import hf_to_megatron
    from slime_ext.convert.tiny_models import write_tiny_hf_model
    from slime_ext.slime_plugins import resume_weights
    from tests.integration.test_resume_weights import Workers, serve

    first = next_rollout_id(url)  # slime resumed from iteration first - 1
    write_tiny_hf_model("qwen3", tmp_path / "base", seed=0)
    hf_to_megatron(tmp_path / "base", tmp_path / "ckpt", iteration=first - 1, progress=False)
    resume_weights.reset()
    workers = Workers(n=1)
    try:
        with serve(workers) as router:
            args = args_for(url, batch=1, n=2)
            vars(args).update(colocate=False, use_kl_loss=True, kl_coef=0.0, load=str(tmp_path / "ckpt"),
                              hf_checkpoint=str(tmp_path / "base"), **vars(router))  # fmt: skip
            outs = []
            for step in range(2):
                rid = first if step == 0 else next_rollout_id(url)
                post(url, [record(f"rs{rid}-{i}", f"rs{rid}", 0.1 * i, version=rid) for i in range(2)])
                outs.append(generate_rollout(args, rid, None))
    finally:
        resume_weights.reset()
    assert outs[0].metrics["rollout/resume/engines_reloaded"] == 1.0
    assert "rollout/resume/engines_reloaded" not in outs[1].metrics
    assert workers.paths == [str(tmp_path / "ckpt_hf" / f"iter_{first - 1:07d}")]
