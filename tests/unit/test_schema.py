"""Unit tests of eval_server.schema: request validation, result JSON round trip, problem_hash."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from eval_server import schema
from eval_server.schema import (
    MAX_CORRECTNESS_TRIALS,
    MAX_SOURCE_CHARS,
    MAX_TIMING_TRIALS,
    STATUSES,
    TOLERANCE_PROFILES,
    Check,
    EvalOptions,
    EvalRequest,
    EvalResult,
    TimingStats,
    TrialResult,
    ValidationError,
    parse_options,
    parse_request,
    problem_hash,
)

pytestmark = pytest.mark.unit

REF = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
CAND = "class ModelNew:\n    pass\n"


def body(**extra):
    return {"reference": REF, "candidate": CAND, **extra}


def opts_error(options) -> str:
    with pytest.raises(ValidationError) as info:
        parse_request(body(options=options))
    return str(info.value)


# --------------------------------------------------------------------------- defaults


def test_options_defaults():
    o = EvalOptions()
    assert (o.correctness_trials, o.timing, o.timing_trials, o.warmup_trials) == (5, True, 100, 3)
    assert (o.seed, o.tolerance, o.timeout_s) == (42, "default", None)
    assert o.backend == "triton"


def test_parse_request_minimal_body_gets_defaults():
    req = parse_request(body())
    assert req == EvalRequest(reference=REF, candidate=CAND)
    assert req.options == EvalOptions()
    assert req.problem_id is None and req.request_id is None


@pytest.mark.parametrize("options", [None, {}])
def test_parse_options_none_or_empty_is_default(options):
    assert parse_options(options) == EvalOptions()


def test_parse_request_all_fields():
    req = parse_request(
        body(
            problem_id="L1/19_ReLU",
            request_id="r-1",
            options={
                "correctness_trials": 3,
                "timing": False,
                "timing_trials": 2,
                "warmup_trials": 0,
                "seed": 7,
                "tolerance": "strict",
                "timeout_s": 30,
            },
        )
    )
    assert req.problem_id == "L1/19_ReLU" and req.request_id == "r-1"
    assert req.options == EvalOptions(
        correctness_trials=3,
        timing=False,
        timing_trials=2,
        warmup_trials=0,
        seed=7,
        tolerance="strict",
        timeout_s=30.0,
    )
    assert isinstance(req.options.timeout_s, float)


def test_timeout_null_means_server_default():
    assert parse_request(body(options={"timeout_s": None})).options.timeout_s is None


def test_request_to_json_round_trips_through_parse():
    req = parse_request(body(options={"seed": 3, "tolerance": "strict"}, problem_id="p"))
    data = json.loads(json.dumps(req.to_json()))
    assert data["options"]["seed"] == 3
    assert parse_request(data) == req


# --------------------------------------------------------------------------- top-level errors


@pytest.mark.parametrize("data", [[], "x", None, 3])
def test_body_must_be_object(data):
    with pytest.raises(ValidationError, match=r"^body: expected dict, got "):
        parse_request(data)


def test_unknown_top_level_field_is_named():
    with pytest.raises(ValidationError) as info:
        parse_request(body(candidat="typo"))
    msg = str(info.value)
    assert msg.startswith("unknown field(s) ['candidat']; allowed: ")
    assert "'candidate'" in msg and "'options'" in msg


@pytest.mark.parametrize("name", ["reference", "candidate"])
def test_missing_source_field(name):
    data = body()
    del data[name]
    with pytest.raises(ValidationError, match=rf"^missing required field '{name}'$"):
        parse_request(data)


@pytest.mark.parametrize("name", ["reference", "candidate"])
@pytest.mark.parametrize("value, got", [(1, "int"), (None, "NoneType"), (["x"], "list"), (True, "bool")])
def test_source_wrong_type(name, value, got):
    with pytest.raises(ValidationError, match=rf"^{name}: expected str, got {got}$"):
        parse_request(body(**{name: value}))


@pytest.mark.parametrize("name", ["reference", "candidate"])
@pytest.mark.parametrize("value", ["", "   \n\t "])
def test_source_empty(name, value):
    with pytest.raises(ValidationError, match=rf"^{name}: must not be empty$"):
        parse_request(body(**{name: value}))


def test_source_too_long():
    parse_request(body(candidate="#" * MAX_SOURCE_CHARS))  # exactly at the limit is fine
    with pytest.raises(ValidationError, match=rf"^candidate: longer than {MAX_SOURCE_CHARS} characters$"):
        parse_request(body(candidate="#" * (MAX_SOURCE_CHARS + 1)))


@pytest.mark.parametrize("name", ["problem_id", "request_id"])
def test_ids_type_and_length(name):
    with pytest.raises(ValidationError, match=rf"^{name}: expected str, got int$"):
        parse_request(body(**{name: 5}))
    with pytest.raises(ValidationError, match=rf"^{name}: longer than 256 characters$"):
        parse_request(body(**{name: "x" * 257}))
    assert getattr(parse_request(body(**{name: "x" * 256})), name) == "x" * 256


# --------------------------------------------------------------------------- options errors


def test_options_must_be_object():
    assert opts_error([1]) == "options: expected dict, got list"


def test_unknown_option_is_named():
    msg = opts_error({"trials": 3})
    assert msg.startswith("options: unknown field(s) ['trials']; allowed: ")
    assert "'correctness_trials'" in msg


@pytest.mark.parametrize("name", ["correctness_trials", "timing_trials", "warmup_trials", "seed"])
@pytest.mark.parametrize("value, got", [(True, "bool"), (False, "bool"), (1.0, "float"), ("3", "str")])
def test_int_options_reject_other_types(name, value, got):
    assert opts_error({name: value}) == f"options.{name}: expected int, got {got}"


@pytest.mark.parametrize("value, got", [(1, "int"), ("yes", "str"), (None, "NoneType")])
def test_timing_must_be_bool(value, got):
    assert opts_error({"timing": value}) == f"options.timing: expected bool, got {got}"


@pytest.mark.parametrize("value, got", [(True, "bool"), ("10", "str")])
def test_timeout_type(value, got):
    assert opts_error({"timeout_s": value}) == f"options.timeout_s: expected int or float, got {got}"


@pytest.mark.parametrize("value", [0, 0.0, -1, -0.5, float("nan"), float("inf"), float("-inf")])
def test_timeout_must_be_finite_and_positive(value):
    assert opts_error({"timeout_s": value}) == f"options.timeout_s: must be a finite number > 0, got {value!r}"


def test_a_nan_timeout_over_http_is_a_400():
    """Python's JSON parser reads the NaN literal: the value check, not the parser, refuses it."""
    import json

    with pytest.raises(ValidationError, match="finite"):
        parse_request(json.loads('{"reference": "x", "candidate": "y", "options": {"timeout_s": NaN}}'))


def test_tolerance_type_and_unknown_profile():
    assert opts_error({"tolerance": 1e-3}) == "options.tolerance: expected str, got float"
    msg = opts_error({"tolerance": "loose"})
    assert msg == f"options.tolerance: unknown profile 'loose'; known: {sorted(TOLERANCE_PROFILES)}"
    assert "'default'" in msg and "'strict'" in msg


def test_backend_option_known_values_and_clear_errors():
    assert parse_request(body(options={"backend": "cuda"})).options.backend == "cuda"
    assert parse_request(body(options={"backend": "triton"})).options.backend == "triton"
    assert (
        opts_error({"backend": "rocm"})
        == "options.backend: unknown backend 'rocm'; known: ['triton', 'cuda']"
    )
    assert opts_error({"backend": 1}) == "options.backend: expected str, got int"
    assert opts_error({"backend": None}) == "options.backend: expected str, got NoneType"


@pytest.mark.parametrize(
    "name, bad, good, message",
    [
        (
            "correctness_trials",
            [0, MAX_CORRECTNESS_TRIALS + 1],
            [1, MAX_CORRECTNESS_TRIALS],
            f"options.correctness_trials: must be in [1, {MAX_CORRECTNESS_TRIALS}]",
        ),
        (
            "timing_trials",
            [1, MAX_TIMING_TRIALS + 1],
            [2, MAX_TIMING_TRIALS],
            f"options.timing_trials: must be in [2, {MAX_TIMING_TRIALS}]",
        ),
        ("warmup_trials", [-1, 1001], [0, 1000], "options.warmup_trials: must be in [0, 1000]"),
        ("seed", [-1, 2**31], [0, 2**31 - 1], "options.seed: must be in [0, 2**31)"),
    ],
)
def test_int_option_ranges(name, bad, good, message):
    for value in bad:
        assert opts_error({name: value}) == message, value
    for value in good:
        assert getattr(parse_options({name: value}), name) == value


# --------------------------------------------------------------------------- results


def full_result() -> EvalResult:
    return EvalResult(
        status="incorrect",
        compiled=True,
        correct=False,
        trials=[
            TrialResult(seed=42, passed=True, max_abs_diff=1e-6, max_rel_diff=2e-6),
            TrialResult(seed=43, passed=False, mismatch="output: shape (2,) != expected (3,)"),
        ],
        max_abs_diff=1e-6,
        max_rel_diff=2e-6,
        checks=[Check("static.try_except", "no try", "reject"), Check("runtime.x", "hm", "warn")],
        kernel_launches=2,
        reference_timing=TimingStats(median_ms=2.0, min_ms=1.9, mean_ms=2.1, iqr_ms=0.1, cv=0.02, trials=99),
        candidate_timing=TimingStats(median_ms=1.0, min_ms=0.9, mean_ms=1.1, iqr_ms=0.05, cv=0.01, trials=99),
        speedup=2.0,
        error={"type": "ValueError", "message": "m", "traceback": "tb"},
        stdout_tail="printed",
        feedback="fb",
        device="cpu (triton interpreter)",
        worker=3,
        elapsed_s=1.25,
        phases={"static": 0.01, "correctness": 1.0},
        problem_hash=problem_hash(REF),
        problem_id="p",
        request_id="r",
    )


def test_result_round_trip_through_json_text():
    res = full_result()
    data = json.loads(json.dumps(res.to_json()))
    assert data["trials"][1]["mismatch"] == "output: shape (2,) != expected (3,)"
    assert data["candidate_timing"]["median_ms"] == 1.0
    back = EvalResult.from_json(data)
    assert back == res
    assert isinstance(back.trials[0], TrialResult)
    assert isinstance(back.checks[0], Check)
    assert isinstance(back.reference_timing, TimingStats)
    assert isinstance(back.candidate_timing, TimingStats)


def test_result_round_trip_minimal_and_null_timings():
    res = EvalResult(status="ok")
    data = res.to_json()
    assert data["reference_timing"] is None and data["trials"] == [] and data["checks"] == []
    assert EvalResult.from_json(data) == res
    assert EvalResult.from_json({"status": "timeout"}) == EvalResult(status="timeout")


def test_from_json_does_not_mutate_input():
    data = full_result().to_json()
    snapshot = json.dumps(data, sort_keys=True)
    EvalResult.from_json(data)
    assert json.dumps(data, sort_keys=True) == snapshot


def test_result_unknown_field_rejected():
    data = EvalResult(status="ok").to_json()
    data["bogus"] = 1
    data["also"] = 2
    with pytest.raises(ValidationError, match=re.escape("result: unknown field(s) ['also', 'bogus']")):
        EvalResult.from_json(data)


def test_result_unknown_nested_field_rejected():
    data = full_result().to_json()
    data["checks"][0]["weight"] = 3
    with pytest.raises(ValidationError, match=re.escape("result.checks[0]: unknown field(s) ['weight']")):
        EvalResult.from_json(data)
    data = full_result().to_json()
    del data["trials"][0]["passed"]
    with pytest.raises(ValidationError, match=re.escape("result.trials[0]:")):
        EvalResult.from_json(data)


def test_result_json_has_every_dataclass_field():
    names = {f.name for f in dataclasses.fields(EvalResult)}
    assert set(EvalResult(status="ok").to_json()) == names


def test_statuses_closed_set():
    assert len(set(STATUSES)) == len(STATUSES) == 10
    assert schema.STATUS_OK in STATUSES and schema.STATUS_SERVER_ERROR in STATUSES
    assert schema.STATUS_UNSUPPORTED == "unsupported" and schema.STATUS_UNSUPPORTED in STATUSES


def test_tolerance_profiles_values():
    assert TOLERANCE_PROFILES["default"]["float32"] == 1e-2
    assert TOLERANCE_PROFILES["strict"]["float32"] == 1e-4
    assert TOLERANCE_PROFILES["strict"]["float16"] == 1e-2


# --------------------------------------------------------------------------- problem_hash


def test_problem_hash_stable_and_content_sensitive():
    h = problem_hash(REF)
    assert h == problem_hash(str(REF))
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    # sha256 of the UTF-8 text: a fixed value, so hashes in stored trajectories stay comparable.
    assert problem_hash("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert problem_hash(REF + " ") != h
    assert problem_hash("é") != problem_hash("e")


@pytest.mark.parametrize(
    "kernel_time, field",
    [
        ({"own_share": 1e9, "own_us": 1.0, "total_us": 1.0}, "own_share"),
        ({"own_share": -0.5, "own_us": 1.0, "total_us": 1.0}, "own_share"),
        ({"own_share": float("nan"), "own_us": 1.0, "total_us": 1.0}, "own_share"),
        ({"own_share": "1", "own_us": 1.0, "total_us": 1.0}, "own_share"),
        ({"own_share": 0.5, "own_us": float("inf"), "total_us": 1.0}, "own_us"),
        ({"own_share": 0.5, "own_us": 1.0, "total_us": -2.0}, "total_us"),
    ],
)
def test_a_profile_outside_what_the_evaluator_makes_is_refused(kernel_time: dict, field: str) -> None:
    """own_share multiplies the profiling-based reward's bonus: only a share in [0, 1] is one."""
    with pytest.raises(ValidationError, match=f"result.kernel_time.{field}"):
        EvalResult.from_json({"status": "ok", "kernel_time": kernel_time})
    ok = {"own_share": 1.0, "own_us": 2.0, "total_us": 2.0}
    assert EvalResult.from_json({"status": "ok", "kernel_time": ok}).kernel_time.own_share == 1.0
