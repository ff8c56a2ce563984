"""Trajectory record / episode -> slime Sample (slime_ext/slime_plugins/samples.py): every Sample
invariant of slime_interfaces.md, both credit modes against hand-computed returns, the fan-out
rollout_id rule, aborted samples. slime itself is the labelled TEST DOUBLE in tests/slime_double."""

from __future__ import annotations

import copy

import pytest

from tests.slime_double import install

install()

from slime.observability.rollout_data_utils import validate_rollout_id_annotated  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

from slime_ext.rollout.episode import Episode, Turn  # noqa: E402
from slime_ext.slime_plugins.samples import (  # noqa: E402
    METADATA_KEY,
    TRAJECTORY_KEY,
    SampleInvariantError,
    check_sample,
    episode_samples,
    fill_sample,
    group_to_samples,
)
from slime_ext.trajectory.record import parse_record  # noqa: E402

pytestmark = pytest.mark.unit

PROMPT = [5, 6, 7, 8]
# response: turn 0 sampled [40, 41, 2], feedback [9, 9] (mask 0), turn 1 sampled [42, 2]
RESPONSE = [40, 41, 2, 9, 9, 42, 2]
MASK = [1, 1, 1, 0, 0, 1, 1]
LOGPROBS = [-0.5, -0.25, -0.125, 0.0, 0.0, -1.0, -0.0625]
OK = {"status": "ok", "compiled": True, "correct": True, "speedup": 1.5, "elapsed_s": 2.0}
WRONG = {"status": "incorrect", "compiled": True, "correct": False, "speedup": None, "elapsed_s": 1.0}


def record(uid: str = "u0", **kw) -> object:
    data = {
        "uid": uid,
        "instance_id": "kb_L1_019",
        "policy_version": 3,
        "prompt_token_ids": PROMPT,
        "response_token_ids": RESPONSE,
        "loss_mask": MASK,
        "rollout_log_probs": LOGPROBS,
        "turn_rewards": [0.1, 0.8],
        "turn_eval_results": [WRONG, OK],
        "reward": 0.1 + 0.4 * 0.8,
        "status": "completed",
        "metadata": {"level": 1},
    }
    data.update(kw)
    return parse_record(data)


def assert_invariants(s: Sample) -> None:
    n = s.response_length
    assert n >= 1 and len(s.tokens) - n >= 1
    assert len(s.loss_mask) == n == len(s.rollout_log_probs)
    assert isinstance(s.reward, float) and s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask, strict=True) if m == 0)
    assert s.effective_response_length == sum(s.loss_mask)
    check_sample(s)


def test_record_to_sample_trajectory_credit() -> None:
    groups, nxt = group_to_samples(
        [record("a"), record("b")], credit="trajectory", group_index=4, first_index=10
    )
    assert nxt == 12 and [s.index for s in groups] == [10, 11]
    s = groups[0]
    assert_invariants(s)
    assert s.tokens == PROMPT + RESPONSE and s.response_length == len(RESPONSE)
    assert s.tokens[-s.response_length :] == RESPONSE
    assert s.loss_mask == MASK and s.rollout_log_probs == LOGPROBS
    assert s.reward == pytest.approx(0.42) and s.status == Sample.Status.COMPLETED
    assert (s.group_index, s.rollout_id, s.label) == (4, 10, "kb_L1_019")
    meta = s.metadata[METADATA_KEY]
    assert meta["level"] == 1 and meta["policy_version"] == 3
    assert [t["correct"] for t in meta["turns"]] == [False, True]
    assert meta["turns"][1]["speedup"] == 1.5 and meta["turns"][0]["eval_s"] == 1.0
    # survives slime's debug dump format
    assert Sample.from_dict(s.to_dict()).tokens == s.tokens


def test_truncated_and_aborted_records() -> None:
    (t,), _ = group_to_samples(
        [record(status="truncated")], credit="trajectory", group_index=0, first_index=0
    )
    assert t.status == Sample.Status.TRUNCATED and not t.remove_sample
    (a,), _ = group_to_samples([record(status="aborted")], credit="trajectory", group_index=0, first_index=0)
    assert a.status == Sample.Status.ABORTED and a.remove_sample and a.reward == 0.0
    assert set(a.loss_mask) == {0} and set(a.rollout_log_probs) == {0.0}
    assert a.tokens == PROMPT + RESPONSE
    # aborted before any token: the last prompt token becomes the one masked response token
    empty = record(status="aborted", response_token_ids=[], loss_mask=[], rollout_log_probs=[])
    (e,), _ = group_to_samples([empty], credit="trajectory", group_index=0, first_index=0)
    assert (
        e.tokens == PROMPT and e.response_length == 1 and e.loss_mask == [0] and e.rollout_log_probs == [0.0]
    )
    check_sample(e)


def test_per_turn_records_fan_out_with_shared_rollout_id() -> None:
    # as buffer_server/runner/agent_runner.py writes them: one record per turn, that turn's reward/result only
    def turn(uid: str, traj: str, k: int, reward: float, result: dict) -> object:
        meta = {"level": 2, TRAJECTORY_KEY: traj, "early_stopped": False}
        return record(uid, sample_index=k, reward=reward, metadata=meta, turn_rewards=[reward],
                      turn_eval_results=[result])  # fmt: skip

    recs = [
        turn("t1-1", "t1", 1, 0.8, OK),
        turn("t1-0", "t1", 0, 0.42, WRONG),
        turn("t2-0", "t2", 0, 0.0, None),
    ]
    out, nxt = group_to_samples(recs, credit="per_turn", group_index=0, first_index=7)
    assert nxt == 9 and [len(x) for x in out] == [2, 1]
    first = out[0]
    assert [s.metadata[METADATA_KEY]["turn"] for s in first] == [0, 1]  # ordered by sample_index
    assert [s.reward for s in first] == [0.42, 0.8]
    # every sibling's summary covers the whole trajectory, in turn order
    for s in first:
        assert [t["status"] for t in s.metadata[METADATA_KEY]["turns"]] == ["incorrect", "ok"]
    assert out[1][0].metadata[METADATA_KEY]["turns"][0]["evaluated"] is False
    assert {s.rollout_id for s in first} == {7} and {s.index for s in first} == {7}
    assert out[1][0].rollout_id == 8
    # slime's check on the whole rollout output (groups x trajectories x turn samples)
    validate_rollout_id_annotated([out, copy.deepcopy(out)])
    broken = copy.deepcopy(out)
    broken[0][1].rollout_id = 99
    with pytest.raises(AssertionError, match="share rollout_id"):
        validate_rollout_id_annotated([broken])


def test_trajectory_credit_refuses_several_records_per_trajectory() -> None:
    recs = [record("x0", metadata={TRAJECTORY_KEY: "t"}), record("x1", metadata={TRAJECTORY_KEY: "t"})]
    with pytest.raises(SampleInvariantError, match="episode.reward.credit"):
        group_to_samples(recs, credit="trajectory", group_index=0, first_index=0)


def _good() -> Sample:
    s = Sample(group_index=0, index=0, rollout_id=0)
    return fill_sample(
        s, prompt_ids=PROMPT, response_ids=RESPONSE, loss_mask=MASK, rollout_log_probs=LOGPROBS,
        reward=0.5, status="completed",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: setattr(s, "index", None), "index must be an int"),
        (lambda s: setattr(s, "group_index", None), "group_index must be an int \\(None only for evaluation"),
        (lambda s: setattr(s, "rollout_id", None), "rollout_id must be an int"),
        (lambda s: setattr(s, "response_length", 0), "response_length must be >= 1"),
        (lambda s: setattr(s, "tokens", RESPONSE), "no prompt before the response"),
        (lambda s: s.loss_mask.pop(), "len\\(loss_mask\\)"),
        (lambda s: s.rollout_log_probs.pop(), "len\\(rollout_log_probs\\)"),
        (lambda s: s.loss_mask.__setitem__(0, 2), "loss_mask\\[0\\] must be 0 or 1"),
        (lambda s: s.rollout_log_probs.__setitem__(3, -0.5), "rollout_log_probs\\[3\\]"),
        (lambda s: s.rollout_log_probs.__setitem__(0, float("nan")), "rollout_log_probs\\[0\\]"),
        (lambda s: setattr(s, "reward", None), "reward must be a finite number"),
        (lambda s: setattr(s, "reward", True), "reward must be a finite number"),
        (lambda s: setattr(s, "status", Sample.Status.PENDING), "status must be"),
        (lambda s: setattr(s, "status", Sample.Status.ABORTED), "aborted sample must be removed"),
    ],
)
def test_check_sample_names_the_broken_invariant(mutate, message) -> None:
    s = _good()
    check_sample(s)
    mutate(s)
    with pytest.raises(SampleInvariantError, match=message):
        check_sample(s)


def test_fill_sample_rejects_mismatched_lengths() -> None:
    with pytest.raises(SampleInvariantError, match="differ in length"):
        fill_sample(
            Sample(group_index=0, index=0, rollout_id=0), prompt_ids=PROMPT, response_ids=RESPONSE,
            loss_mask=MASK[:-1], rollout_log_probs=LOGPROBS, reward=0.0, status="completed",
        )  # fmt: skip


# ----------------------------------------------------------------------------- episodes


def make_episode(rewards: list[float], status: str = "completed", gamma: float = 0.4) -> Episode:
    """Three turns of 2 sampled tokens each, 3 feedback tokens between turns."""
    ep = Episode(problem_id="p", messages=[], prompt_ids=[1, 2, 3], gamma=gamma, status=status)
    for t, r in enumerate(rewards):
        if t:
            ep.response_ids += [9, 9, 9]
            ep.loss_mask += [0, 0, 0]
            ep.rollout_log_probs += [0.0, 0.0, 0.0]
        start = len(ep.response_ids)
        ep.response_ids += [100 + 2 * t, 101 + 2 * t]
        ep.loss_mask += [1, 1]
        ep.rollout_log_probs += [-0.5 - t, -0.25 - t]
        result = {"status": "ok", "compiled": True, "correct": True, "speedup": None, "elapsed_s": 1.0}
        ep.turns.append(Turn(index=t, start=start, end=start + 2, finish_reason="stop", text=f"t{t}",
                             eval_result=result, reward=r))  # fmt: skip
    ep.check()
    return ep


def base_sample() -> Sample:
    return Sample(group_index=3, index=17, prompt="ref source", label="kb_L1_001", session_id="s")


def test_episode_trajectory_credit_hand_computed() -> None:
    ep = make_episode([0.1, 0.3, 1.3])
    s = episode_samples(ep, base_sample(), credit="trajectory", info={"instance_id": "kb", "level": 1})
    assert isinstance(s, Sample)
    assert s.reward == pytest.approx(0.1 + 0.4 * 0.3 + 0.16 * 1.3)  # R = 0.428
    assert s.tokens == [1, 2, 3] + ep.response_ids and s.response_length == len(ep.response_ids)
    assert s.loss_mask == ep.loss_mask and s.rollout_log_probs == ep.rollout_log_probs
    assert (s.index, s.group_index, s.rollout_id, s.session_id) == (17, 3, 17, "s")
    assert s.response == "t0t1t2"
    assert_invariants(s)


def test_episode_per_turn_credit_hand_computed() -> None:
    ep = make_episode([0.1, 0.3, 1.3], status="truncated")
    out = episode_samples(ep, base_sample(), credit="per_turn", info={"instance_id": "kb", "level": 1})
    assert [s.reward for s in out] == pytest.approx([0.428, 0.82, 1.3])  # G_t = r_t + 0.4 G_{t+1}
    for t, s in enumerate(out):
        turn = ep.turns[t]
        assert s.tokens == [1, 2, 3] + ep.response_ids[: turn.end]
        assert s.tokens[-s.response_length :] == ep.response_ids[turn.start : turn.end]
        assert s.loss_mask == [1, 1] and s.rollout_log_probs == ep.rollout_log_probs[turn.start : turn.end]
        assert (s.index, s.group_index, s.rollout_id) == (17, 3, 17)
        assert s.metadata[METADATA_KEY]["turn"] == t
        check_sample(s)
    assert [s.status for s in out] == [
        Sample.Status.COMPLETED,
        Sample.Status.COMPLETED,
        Sample.Status.TRUNCATED,
    ]
    assert len({id(s) for s in out}) == 3 and len({id(s.tokens) for s in out}) == 3
    validate_rollout_id_annotated([[out]])


def test_aborted_episode_is_one_removed_sample() -> None:
    ep = make_episode([0.1, 0.3], status="aborted")
    out = episode_samples(ep, base_sample(), credit="per_turn", info={})
    assert len(out) == 1 and out[0].remove_sample and out[0].reward == 0.0
    assert out[0].status == Sample.Status.ABORTED and sum(out[0].loss_mask) == 0
    single = episode_samples(
        make_episode([0.3], status="aborted"), base_sample(), credit="trajectory", info={}
    )
    assert isinstance(single, Sample) and single.remove_sample


def test_eval_sample_without_group_index() -> None:
    """slime's eval_rollout sets `index` on each eval sample and leaves `group_index` None: allowed
    for evaluation only; every other invariant still holds there."""
    s = _good()
    s.group_index = None
    check_sample(s, evaluation=True)
    with pytest.raises(SampleInvariantError, match="group_index"):
        check_sample(s)
    s.rollout_id = None
    with pytest.raises(SampleInvariantError, match="rollout_id must be an int"):
        check_sample(s, evaluation=True)


def test_episode_from_an_eval_sample() -> None:
    """The in-slime eval path: a Sample as slime's eval_rollout builds it (index, no group_index)."""
    base = Sample(index=4, prompt="ref source", label="kb_L1_001")
    out = episode_samples(make_episode([0.1, 0.3]), base, credit="trajectory", info={}, evaluation=True)
    assert (out.index, out.group_index, out.rollout_id) == (4, None, 4)
    assert out.reward == pytest.approx(0.1 + 0.4 * 0.3)
    with pytest.raises(SampleInvariantError, match="group_index"):
        episode_samples(make_episode([0.1]), Sample(index=4, prompt="x"), credit="trajectory", info={})
