"""Unit tests of slime_ext.trajectory.record: parse_record validation (field names and indices in
every message), defaults, JSON round trip; and of krl_common.fastjson (both backends agree)."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest

from krl_common import fastjson
from slime_ext.trajectory.record import (
    FIELD_NAMES,
    MAX_ID_CHARS,
    MAX_JSON_DEPTH,
    MAX_TOKEN_ID,
    REQUIRED_FIELDS,
    STATUSES,
    TrajectoryRecord,
    ValidationError,
    parse_record,
)

pytestmark = pytest.mark.unit


def record(**overrides):
    """A valid 2-turn record as JSON: response = model turn, feedback (mask 0), model turn."""
    data = {
        "uid": "run1-step3-p17-s0",
        "instance_id": "level1/19_ReLU",
        "policy_version": 3,
        "prompt_token_ids": [151644, 872, 198, 7771],
        "response_token_ids": [40, 1184, 264, 151645, 9, 9, 40, 1184],
        "loss_mask": [1, 1, 1, 1, 0, 0, 1, 1],
        "rollout_log_probs": [-0.5, -0.01, -1.25, -0.002, 0.0, 0.0, -0.3, -0.04],
        "turn_rewards": [0.0, 1.0],
        "turn_eval_results": [
            {"status": "incorrect", "max_abs_diff": 0.4},
            {"status": "ok", "speedup": None},
        ],
        "reward": 0.4,
        "status": "completed",
        "metadata": {"gen_s": [1.5, 2.0], "turns": 2},
        "created_at": 1_700_000_000.5,
        "sample_index": 0,
    }
    data.update(overrides)
    return data


def error_of(data, **kwargs) -> str:
    with pytest.raises(ValidationError) as exc:
        parse_record(data, **kwargs)
    return str(exc.value)


def test_valid_record_round_trips_through_json():
    rec = parse_record(record())
    assert isinstance(rec, TrajectoryRecord)
    assert rec.response_length == 8
    out = rec.to_json()
    assert list(out) == [f.name for f in dataclasses.fields(TrajectoryRecord)]  # field order
    assert set(out) == FIELD_NAMES
    assert parse_record(json.loads(json.dumps(out))) == rec
    assert parse_record(fastjson.loads(fastjson.dumps(out))) == rec
    assert rec.validate() == rec


def test_optional_fields_get_defaults():
    data = record()
    for name in ("metadata", "created_at", "sample_index"):
        del data[name]
    before = time.time()
    rec = parse_record(data)
    assert rec.metadata == {} and rec.sample_index == 0
    assert before <= rec.created_at <= time.time()
    assert set(REQUIRED_FIELDS) == FIELD_NAMES - {"metadata", "created_at", "sample_index"}


def test_integers_in_float_fields_become_floats():
    rec = parse_record(record(reward=1, turn_rewards=[0, 1], rollout_log_probs=[-1, 0, -2, 0, 0, 0, -1, -1]))
    assert type(rec.reward) is float and rec.reward == 1.0
    assert all(type(v) is float for v in rec.turn_rewards + rec.rollout_log_probs)


def test_empty_response_is_allowed():
    rec = parse_record(
        record(
            response_token_ids=[], loss_mask=[], rollout_log_probs=[], turn_rewards=[], turn_eval_results=[]
        )
    )
    assert rec.response_length == 0


@pytest.mark.parametrize("name", sorted(REQUIRED_FIELDS))
def test_missing_required_field_is_named(name):
    data = record()
    del data[name]
    assert error_of(data) == f"{name}: missing required field"


def test_unknown_fields_are_rejected_and_listed():
    msg = error_of(record(reward_model="x", extra=1))
    assert "unknown field(s) ['extra', 'reward_model']" in msg


def test_body_must_be_an_object():
    assert error_of([1, 2]) == "record: expected dict, got list"
    assert error_of("x", path="records[4]") == "records[4]: expected dict, got str"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"uid": ""}, "uid: must not be empty"),
        ({"uid": "   "}, "uid: must not be empty"),
        ({"uid": 7}, "uid: expected str, got int"),
        ({"uid": "u" * (MAX_ID_CHARS + 1)}, f"uid: longer than {MAX_ID_CHARS} characters"),
        ({"uid": "bad\ud800"}, "uid: not valid Unicode (lone surrogate)"),
        ({"instance_id": ""}, "instance_id: must not be empty"),
        ({"instance_id": None}, "instance_id: expected str, got NoneType"),
        ({"policy_version": True}, "policy_version: expected int, got bool"),
        ({"policy_version": 1.0}, "policy_version: expected int, got float"),
        ({"policy_version": -1}, "policy_version: -1 is out of range"),
        ({"reward": True}, "reward: expected int or float, got bool"),
        ({"reward": "1.0"}, "reward: expected int or float, got str"),
        ({"reward": math.nan}, "reward: must be a finite number, got nan"),
        ({"reward": math.inf}, "reward: must be a finite number, got inf"),
        ({"reward": 10**400}, "reward: number out of range"),
        ({"status": "ok"}, "status: 'ok' is not one of ['completed', 'truncated', 'aborted']"),
        ({"status": 1}, "status: expected str, got int"),
        ({"created_at": -1.0}, "created_at: must be >= 0"),
        ({"created_at": math.nan}, "created_at: must be a finite number"),
        ({"sample_index": -1}, "sample_index: -1 is out of range"),
        ({"sample_index": False}, "sample_index: expected int, got bool"),
        ({"metadata": []}, "metadata: expected dict, got list"),
        ({"turn_rewards": [0.0, math.nan]}, "turn_rewards[1]: must be a finite number"),
        ({"turn_rewards": 1.0}, "turn_rewards: expected list, got float"),
        ({"turn_eval_results": [{}, 3]}, "turn_eval_results[1]: expected dict, got int"),
        ({"turn_eval_results": [{}, []]}, "turn_eval_results[1]: expected dict, got list"),
        ({"turn_eval_results": [{}]}, "turn_eval_results: length 1 != len(turn_rewards) 2"),
    ],
)
def test_scalar_field_errors_name_the_field(overrides, expected):
    assert expected in error_of(record(**overrides))


@pytest.mark.parametrize(
    ("field", "index", "value", "expected"),
    [
        ("prompt_token_ids", 2, True, "prompt_token_ids[2]: expected int, got bool"),
        ("prompt_token_ids", 0, 1.0, "prompt_token_ids[0]: expected int, got float"),
        ("prompt_token_ids", 3, -1, f"prompt_token_ids[3]: token id -1 is out of range [0, {MAX_TOKEN_ID}]"),
        ("response_token_ids", 5, MAX_TOKEN_ID + 1, "response_token_ids[5]: token id"),
        ("response_token_ids", 7, "9", "response_token_ids[7]: expected int, got str"),
        ("loss_mask", 3, 2, "loss_mask[3]: expected 0 or 1, got 2"),
        ("loss_mask", 6, True, "loss_mask[6]: expected int, got bool"),
        ("loss_mask", 0, 1.0, "loss_mask[0]: expected int, got float"),
        ("rollout_log_probs", 2, math.nan, "rollout_log_probs[2]: must be a finite number, got nan"),
        ("rollout_log_probs", 7, -math.inf, "rollout_log_probs[7]: must be a finite number, got -inf"),
        ("rollout_log_probs", 1, None, "rollout_log_probs[1]: expected float or int, got NoneType"),
        ("rollout_log_probs", 0, False, "rollout_log_probs[0]: expected float or int, got bool"),
        ("rollout_log_probs", 5, -0.7, "rollout_log_probs[5]: must be 0.0 where loss_mask is 0, got -0.7"),
    ],
)
def test_list_element_errors_name_field_and_index(field, index, value, expected):
    data = record()
    data[field] = list(data[field])
    data[field][index] = value
    assert expected in error_of(data)


def test_a_finite_sum_overflow_is_not_mistaken_for_a_bad_value():
    logps = [-1e308, -1e308, -1.0, -1.0, 0.0, 0.0, -1.0, -1.0]  # sum overflows to -inf
    assert parse_record(record(rollout_log_probs=logps)).rollout_log_probs[0] == -1e308


def test_negative_zero_counts_as_zero_under_mask_0():
    parse_record(record(rollout_log_probs=[-0.5, -0.01, -1.25, -0.002, -0.0, 0.0, -0.3, -0.04]))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("loss_mask", [1, 1], "loss_mask: length 2 != len(response_token_ids) 8"),
        ("rollout_log_probs", [-0.1] * 9, "rollout_log_probs: length 9 != len(response_token_ids) 8"),
        ("loss_mask", "11110011", "loss_mask: expected list, got str"),
        ("prompt_token_ids", [], "prompt_token_ids: must not be empty"),
    ],
)
def test_length_and_shape_errors(field, value, expected):
    assert expected in error_of(record(**{field: value}))


def test_path_prefixes_every_message():
    data = record(loss_mask=[1, 1, 1, 1, 0, 0, 1, 5])
    assert error_of(data, path="records[3]") == "records[3].loss_mask[7]: expected 0 or 1, got 5"
    assert error_of(record(extra=1), path="records[0]").startswith("records[0]: unknown field(s) ['extra']")
    data = record()
    del data["uid"]
    assert error_of(data, path="records[2]") == "records[2].uid: missing required field"


@pytest.mark.parametrize("strict_json", [False, True])
def test_free_form_nesting_depth_is_bounded(strict_json):
    deep: dict = {}
    node = deep
    for _ in range(MAX_JSON_DEPTH + 2):
        node["k"] = {}
        node = node["k"]
    msg = error_of(record(metadata=deep), strict_json=strict_json)
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in msg and msg.startswith("metadata")


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (
            {"timing": {"gen_s": [1.0, math.nan]}},
            "metadata.timing.gen_s[1]: must be a finite number, got nan",
        ),
        ({"n": 2**64}, "metadata.n: integer 18446744073709551616 does not fit in 64 bits"),
        ({"s": "a\udc80"}, "metadata.s: not valid Unicode"),
        ({1: "x"}, "metadata: object key 1 is not a string"),
        ({"t": (1, 2)}, "metadata.t: tuple is not a JSON value"),
        ({"o": object()}, "metadata.o: object is not a JSON value"),
    ],
)
def test_free_form_values_are_checked_value_by_value(metadata, expected):
    assert expected in error_of(record(metadata=metadata))


def test_free_form_eval_results_are_checked_with_index():
    results = [{"status": "ok"}, {"trials": [{"max_abs_diff": math.inf}]}]
    msg = error_of(record(turn_eval_results=results))
    assert "turn_eval_results[1].trials[0].max_abs_diff: must be a finite number, got inf" in msg


def test_a_turn_that_was_not_evaluated_has_a_null_eval_result():
    rec = parse_record(record(turn_eval_results=[None, {"status": "ok"}]))
    assert rec.turn_eval_results == [None, {"status": "ok"}]


def test_every_status_is_accepted():
    for status in STATUSES:
        assert parse_record(record(status=status)).status == status


# --------------------------------------------------------------------------- fastjson


def test_fastjson_backends_agree(monkeypatch):
    data = record(metadata={"text": "h\u00e9llo \u2603", "nested": {"x": [1, 2.5, None, True]}})
    active = fastjson.dumps(data)
    monkeypatch.setattr(fastjson, "_orjson", None)
    stdlib = fastjson.dumps(data)
    assert json.loads(active) == json.loads(stdlib) == data
    assert b"\\u" not in stdlib  # UTF-8, not ASCII escapes, like orjson
    assert fastjson.loads(active) == data


@pytest.mark.parametrize("text", [b"NaN", b"[Infinity]", b'{"a": -Infinity}'])
def test_fastjson_rejects_non_finite_literals_in_both_backends(monkeypatch, text):
    with pytest.raises(ValueError):
        fastjson.loads(text)
    monkeypatch.setattr(fastjson, "_orjson", None)
    with pytest.raises(ValueError, match="not valid JSON"):
        fastjson.loads(text)
