"""Unit tests of eval_server.feedback.build_feedback: every status carries its evidence."""

from __future__ import annotations

import re

import pytest

from eval_server.feedback import build_feedback, failure_result
from eval_server.schema import (
    STATUS_COMPILE_ERROR,
    STATUS_CRASHED,
    STATUS_INCORRECT,
    STATUS_OK,
    STATUS_REFERENCE_ERROR,
    STATUS_REJECTED,
    STATUS_RUNTIME_ERROR,
    STATUS_SERVER_ERROR,
    STATUS_TIMEOUT,
    STATUSES,
    Check,
    EvalResult,
    TimingStats,
    TrialResult,
)

pytestmark = pytest.mark.unit

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "candidate.py", line 12, in forward\n'
    "    relu_kernel[grid](x, out, n)\n"
    "TypeError: relu_kernel() missing 1 required positional argument: 'BLOCK_SIZE'"
)


def timing(median_ms: float, trials: int = 99) -> TimingStats:
    return TimingStats(
        median_ms=median_ms, min_ms=median_ms, mean_ms=median_ms, iqr_ms=0.0, cv=0.0, trials=trials
    )


@pytest.mark.parametrize("status", STATUSES)
def test_first_line_names_status(status):
    text = build_feedback(EvalResult(status=status))
    first = text.splitlines()[0]
    assert first.startswith(f"Status: {status}. ")
    assert len(first) > len(f"Status: {status}. ") + 10  # a headline follows


def test_unknown_status_has_no_trailing_space():
    assert build_feedback(EvalResult(status="weird")) == "Status: weird."


@pytest.mark.parametrize("status", [STATUS_COMPILE_ERROR, STATUS_RUNTIME_ERROR])
def test_error_statuses_carry_the_traceback_and_no_instruction(status):
    res = EvalResult(status=status, error={"type": "TypeError", "message": "short", "traceback": TRACEBACK})
    text = build_feedback(res)
    assert TRACEBACK in text
    assert "short" not in text  # the traceback already contains the message
    assert text.index(TRACEBACK) > text.index("Status:")
    last = text.splitlines()[-1]
    assert not re.search(r"\b(Fix|Return|Rewrite)\b", text)  # the episode's message instructs, once
    assert last == TRACEBACK.splitlines()[-1] or last.startswith("Likely causes:")


def test_an_evaluator_failure_says_where_it_failed():
    """server_error from a failed judge: the traceback (which line of the evaluator failed) is in
    the result's error and its feedback."""
    from eval_server.schema import EvalRequest

    req = EvalRequest(reference="r", candidate="c")
    tb = 'Traceback (most recent call last):\n  File "eval_server/judge/gpu_calls.py", line 9, in run\nOutOfMemoryError: x'
    res = failure_result(req, "server_error", "Evaluator failure: OutOfMemoryError: x", traceback=tb)
    assert res.error is not None and res.error["traceback"] == tb
    assert res.feedback.endswith(tb) and "not your fault" in res.feedback


def test_message_used_when_traceback_missing_or_empty():
    res = EvalResult(
        status=STATUS_COMPILE_ERROR,
        error={"type": "MissingModelNew", "message": "no ModelNew here", "traceback": ""},
    )
    assert build_feedback(res).endswith("\n\nno ModelNew here")


def test_compile_error_exact_text():
    res = EvalResult(
        status=STATUS_COMPILE_ERROR,
        error={"type": "SyntaxError", "message": "m", "traceback": "SyntaxError: bad"},
    )
    assert build_feedback(res) == (
        "Status: compile_error. Your code failed to compile or import.\n"
        "\n"
        "SyntaxError: bad"
    )


def test_rejected_lists_each_reject_check_with_id_and_message():
    res = EvalResult(
        status=STATUS_REJECTED,
        checks=[
            Check("static.try_except", "try/except is not allowed. Found: line 7: try/except."),
            Check("runtime.torch_compute", "torch did the work: add x1."),
            Check("runtime.some_warning", "only a warning", severity="warn"),
        ],
    )
    text = build_feedback(res)
    assert "Checks that failed:" in text
    assert "- [static.try_except] try/except is not allowed. Found: line 7: try/except." in text
    assert "- [runtime.torch_compute] torch did the work: add x1." in text
    assert "runtime.some_warning" not in text and "only a warning" not in text


def test_incorrect_lists_trial_diffs_with_tolerance():
    res = EvalResult(
        status=STATUS_INCORRECT,
        compiled=True,
        trials=[
            TrialResult(seed=42, passed=True, max_abs_diff=1e-5, max_rel_diff=1e-5),
            TrialResult(
                seed=43,
                passed=False,
                max_abs_diff=0.5,
                max_rel_diff=0.25,
                detail="output: 3/12 elements (25%) outside tolerance; worst at [1, 2]: got 0.5, expected 0",
            ),
            TrialResult(seed=44, passed=False, mismatch="output: shape (4, 3) != expected (4, 4)"),
        ],
    )
    text = build_feedback(res, tolerance=0.01)
    assert "Correctness: 1/3 trials passed." in text
    assert (
        "- trial seed 43: max abs diff 0.5 (tolerance atol=rtol=0.01)\n  output: 3/12 elements (25%) outside tolerance; worst at [1, 2]: got 0.5, expected 0\n"
        in text
    )
    assert "- trial seed 44: output: shape (4, 3) != expected (4, 4)" in text
    assert "seed 42" not in text  # passing trials are not listed
    assert text.endswith(
        "Likely causes: indexing, masks for the tail elements, reduction order, the grid or dtypes."
    )


def test_incorrect_without_tolerance_and_missing_diffs():
    res = EvalResult(status=STATUS_INCORRECT, trials=[TrialResult(seed=5, passed=False)])
    text = build_feedback(res)
    assert "- trial seed 5: max abs diff n/a\n" in text
    assert "tolerance" not in text


def test_incorrect_shows_at_most_three_failed_trials():
    trials = [TrialResult(seed=s, passed=False, max_abs_diff=1.0, max_rel_diff=1.0) for s in range(10, 15)]
    text = build_feedback(EvalResult(status=STATUS_INCORRECT, trials=trials))
    assert "Correctness: 0/5 trials passed." in text
    assert [s for s in range(10, 15) if f"trial seed {s}:" in text] == [10, 11, 12]


def test_ok_with_timing_reports_speedup_and_both_medians():
    res = EvalResult(
        status=STATUS_OK,
        compiled=True,
        correct=True,
        trials=[TrialResult(seed=42, passed=True, max_abs_diff=3e-7, max_rel_diff=1e-6)] * 5,
        max_abs_diff=3e-7,
        reference_timing=timing(2.5),
        candidate_timing=timing(1.25, trials=99),
        speedup=2.0,
    )
    text = build_feedback(res)
    assert "Max abs diff over 5 trials: 3e-07." in text
    assert "Speedup: 2.00x (reference 2.5 ms, yours 1.25 ms, median of 99)." in text
    assert "slower" not in text
    assert "not measured" not in text


def test_ok_slower_than_reference_gets_advice():
    res = EvalResult(
        status=STATUS_OK, reference_timing=timing(1.0), candidate_timing=timing(4.0), speedup=0.25
    )
    text = build_feedback(res)
    assert "Speedup: 0.25x (reference 1 ms, yours 4 ms, median of 99)." in text
    assert "Your kernel is slower than the reference" in text


def test_ok_without_timing_says_not_measured():
    res = EvalResult(
        status=STATUS_OK, trials=[TrialResult(seed=1, passed=True, max_abs_diff=0.0)], max_abs_diff=0.0
    )
    text = build_feedback(res)
    assert text == (
        "Status: ok. Your kernel compiled and produced correct results.\n"
        "Max abs diff over 1 trials: 0.\n"
        "Speed was not measured on this evaluator."
    )


def test_ok_with_speedup_but_missing_timing_says_not_measured():
    res = EvalResult(status=STATUS_OK, speedup=1.5, reference_timing=timing(1.0))
    text = build_feedback(res)
    assert "Speedup" not in text and "Speed was not measured on this evaluator." in text


@pytest.mark.parametrize(
    "status, message, fix",
    [
        (STATUS_TIMEOUT, "Evaluation exceeded 60 s and was killed.", "Likely causes: a loop that never ends"),
        (STATUS_CRASHED, "Process died with signal 11 (SIGSEGV).", "Likely causes: out-of-bounds memory accesses"),
    ],
)
def test_timeout_and_crash_carry_message_and_fix(status, message, fix):
    text = build_feedback(EvalResult(status=status, error={"type": "X", "message": message}))
    assert f"\n\n{message}\n\n" in text
    assert text.splitlines()[-1].startswith(fix)


@pytest.mark.parametrize("status", [STATUS_REFERENCE_ERROR, STATUS_SERVER_ERROR])
def test_not_your_fault_statuses(status):
    res = EvalResult(status=status, error={"type": "E", "message": "m", "traceback": "Traceback: boom"})
    text = build_feedback(res)
    assert "this is not your fault" in text.splitlines()[0]
    assert text.endswith("Traceback: boom")  # no fix advice for the candidate
