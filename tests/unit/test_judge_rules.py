"""The judge's pure rules: the second input shape, calls per window, the secret choice of kept
calls, and the runner statuses it accepts."""

from __future__ import annotations

import math
import random
import types

import pytest

from eval_server import samples
from eval_server.judge import timing as jtiming
from eval_server.judge.evaluate import RUNNER_STATUSES
from eval_server.pipeline import shapes
from eval_server.schema import STATUSES

pytestmark = pytest.mark.unit


def test_second_shape_scales_get_inputs_only_constants() -> None:
    src = samples.load_problem("gemm_scale_leakyrelu")
    scaled = shapes.scaled_constants(src)
    assert scaled == {"batch_size": (16, 13)}  # in/out features build the weights: untouched


def test_second_shape_of_every_bundled_problem_is_odd_and_smaller() -> None:
    for name in samples.problem_names():
        scaled = shapes.scaled_constants(samples.load_problem(name))
        assert scaled, name
        for old, new in scaled.values():
            assert 1 <= new < old and (old % 2 or new % 2)


def test_no_second_shape_without_input_only_constants() -> None:
    src = "N = 8\nclass Model: pass\ndef get_inputs():\n    return [N]\ndef get_init_inputs():\n    return [N]\n"
    assert shapes.scaled_constants(src) == {}
    assert shapes.scaled_constants("def broken(:") == {}


def test_the_second_shape_is_imported_scaled_and_warmed_with_its_own_sizes(tmp_path) -> None:
    """The runner warms the candidate at the judge's second shape (the same rule, the same sizes):
    Triton compiles that shape's kernels in the runner's hold, not in the judge's."""
    import torch

    variant, scaled = shapes.import_variant(samples.load_problem("relu"), tmp_path, "reference_shape")
    assert scaled and all(getattr(variant, name) == new for name, (_, new) in scaled.items())
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, *args):
            seen.append([tuple(a.shape) for a in args if isinstance(a, torch.Tensor)])
            raise RuntimeError("a failure here is for the judge's own call to find")

    shapes.warm(variant, Recorder(), torch.device("cpu"), seed=0)
    assert seen == [[tuple(a.shape) for a in variant.get_inputs() if isinstance(a, torch.Tensor)]]
    assert shapes.import_variant("x = 1\n", tmp_path, "none") is None


def test_second_shape_skips_ones_and_booleans() -> None:
    src = "A = 1\nB = True\nC = 64\ndef get_inputs():\n    return [A, B, C]\n"
    assert shapes.scaled_constants(src) == {"C": (64, 49)}


@pytest.mark.parametrize(
    "median_ms, k",
    [(0.002, 64), (0.005, 64), (0.035, 16), (0.1, 8), (0.3, 2), (0.5, 1), (3.0, 1), (math.nan, 1)],
)
def test_calls_per_window(median_ms: float, k: int) -> None:
    assert jtiming.choose_k(median_ms) == k


def test_kept_calls_respect_the_cap_and_vary() -> None:
    rng = random.Random(0)
    picks = [jtiming._keep(10, 4, 3, rng) for _ in range(200)]
    assert all(len(p) <= 3 for p in picks)
    assert all(0 <= w < 10 and 0 <= j < 4 for p in picks for w, j in p)
    assert len({frozenset(p) for p in picks}) > 100  # not a fixed pattern a runner could learn


def test_the_runner_cannot_claim_an_evaluator_status() -> None:
    assert set(STATUSES) >= RUNNER_STATUSES
    assert not RUNNER_STATUSES & {"server_error", "reference_error", "unsupported"}


class _NoisyWindows:
    """Stands in for a GpuSession (CUDA, not here): windows of ~0.2 ms that never settle."""

    def __init__(self) -> None:
        self.windows = 0
        self.rng = random.Random(1)

    def run(self, windows: int, k: int, keep: object = None, flush: bool = True) -> tuple[object, list]:
        from eval_server.judge.gpu_calls import Windows

        self.windows += windows
        return Windows(window_ms=[0.2 * (1 + self.rng.random()) for _ in range(windows)]), []


def test_warm_up_of_short_noisy_windows_is_bounded_by_windows_not_only_time() -> None:
    session = _NoisyWindows()
    jtiming.warm_up(session, 64)  # type: ignore[arg-type]
    assert session.windows <= jtiming.WARMUP_MAX_WINDOWS


def test_a_windows_input_sets_are_distinct_and_reproducible_from_its_seed() -> None:
    import torch

    from eval_server.pipeline import loader

    module = types.ModuleType("p")
    exec(samples.load_problem("relu"), module.__dict__)
    sets = loader.make_input_sets(module, 1234, torch.device("cpu"), 3)
    assert not torch.equal(sets[0][0], sets[1][0]) and not torch.equal(sets[1][0], sets[2][0])
    again = loader.make_input_sets(module, 1234, torch.device("cpu"), 3)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(sets, again, strict=True))
    assert not torch.equal(loader.make_input_sets(module, 1235, torch.device("cpu"), 1)[0][0], sets[0][0])


class _HandoverWindows:
    """Stands in for a GpuSession: every window as long as the hand-over (two CUDA contexts
    time-slicing without MPS: the hand-over's jitter covers a short reference's whole window)."""

    def run(self, windows: int, k: int, keep: object = None, flush: bool = True) -> tuple[object, list]:
        from eval_server.judge.gpu_calls import Windows

        return Windows(window_ms=[0.29] * windows, pre_ms=[0.01] * windows, post_ms=[0.01] * windows), []


def test_a_reference_no_longer_than_the_hand_over_is_the_evaluators_error_not_a_speedup() -> None:
    from eval_server.judge import evaluate as jeval
    from eval_server.schema import STATUS_OK, STATUS_SERVER_ERROR, EvalRequest, result_for

    timed = jtiming.time_model(
        _HandoverWindows(),  # type: ignore[arg-type]
        4,
        max_windows=20,
        min_windows=10,
        ci_rel=0.0,
        keep_cap=2,
        warm_min_ms=0.0,
        handover_ms=0.3,
    )
    assert timed.stats.median_ms == 0.0
    request = EvalRequest(reference="x", candidate="y")
    result = result_for(request, STATUS_OK, "cuda:0")
    with pytest.raises(jeval._Done):
        jeval._check_resolved(result, timed, 0.3)
    assert result.status == STATUS_SERVER_ERROR and result.speedup is None
    assert "MPS" in result.error["message"] and "0.29 ms for 4 calls" in result.error["message"]


def test_a_speedup_is_finite_whatever_the_candidates_time() -> None:
    assert jtiming.speedup(0.004, 0.0) == pytest.approx(4.0)  # against MIN_CALL_MS, not 0
    assert jtiming.speedup(0.004, 0.002) == pytest.approx(2.0)
    assert math.isfinite(jtiming.speedup(5.0, -1.0))


def test_the_runner_allocations_a_run_mapped_are_closed_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mapping keeps the runner's freed memory alive: none stays open between runs."""
    from eval_server import gpu_ipc
    from eval_server.judge.gpu_calls import GpuSession

    closed: list[int] = []
    monkeypatch.setattr(gpu_ipc, "close_handle", closed.append)
    session = GpuSession.__new__(GpuSession)  # no CUDA here: only the mapping bookkeeping
    session._mapped = {"a": (100, 8), "b": (200, 8)}
    session._views = {("out", "a", 0, "float32", 2): object()}
    session.unmap()
    assert sorted(closed) == [100, 200] and session._mapped == {} and session._views == {}


def _mapping_session(
    monkeypatch: pytest.MonkeyPatch, sizes: dict[str, int]
) -> tuple[object, list[int], list[str]]:
    """A GpuSession's mapping bookkeeping, with the CUDA driver's IPC calls stood in for (no GPU
    here): opening a handle gives a base address, closing it is recorded, the snapshot waits too."""
    import torch

    from eval_server import gpu_ipc
    from eval_server.judge.gpu_calls import GpuSession, Leaf

    bases = {h: 1000 * (i + 1) for i, h in enumerate(sizes)}
    closed: list[int] = []
    waits: list[str] = []
    monkeypatch.setattr(gpu_ipc, "open_handle", lambda raw: bases[raw.hex()])
    size_at = {bases[h]: size for h, size in sizes.items()}
    monkeypatch.setattr(gpu_ipc, "address_range", lambda base: (base, size_at[base]))
    monkeypatch.setattr(gpu_ipc, "tensor_at", lambda ptr, nbytes, dtype, shape, device: ("view", ptr))
    monkeypatch.setattr(gpu_ipc, "close_handle", closed.append)
    session = GpuSession.__new__(GpuSession)
    session.leaves = [Leaf("out", torch.float32, (2,))]
    session.device = torch.device("cpu")
    session._mapped, session._views = {}, {}
    session._last_snapshot = "previous window's snapshot"
    session._wait = waits.append  # type: ignore[method-assign]
    return session, closed, waits


def _window(handle: str) -> dict[str, object]:
    return {"outputs": [[{"handle": handle, "offset": 0, "dtype": "float32", "shape": [2]}]]}


def test_a_runner_that_moves_its_outputs_every_window_leaves_the_judge_few_mappings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runner whose allocator takes a new block every window (memory pressure) had the judge
    keep every window's mapping, and with it the freed memory, to the run's end: now the judge
    closes the older ones once they hold more than the current window's, after the previous
    window's snapshot is done."""
    handles = [f"{i:02x}" * 4 for i in range(1, 11)]
    session, closed, waits = _mapping_session(monkeypatch, dict.fromkeys(handles, 8 << 30))
    most = 0
    for h in handles:
        session._outputs(_window(h), 1)
        most = max(most, len(session._mapped))
        assert h in session._mapped
    assert most <= 3 and len(closed) >= len(handles) - 3
    assert waits and all(w == "previous window's snapshot" for w in waits)
    assert all(key[1] in session._mapped for key in session._views)


def test_outputs_that_stay_or_alternate_between_two_blocks_are_never_closed_or_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session, closed, waits = _mapping_session(monkeypatch, {"aa" * 4: 64 << 20, "bb" * 4: 64 << 20})
    for h in ["aa" * 4] * 3 + ["aa" * 4, "bb" * 4] * 5:
        session._outputs(_window(h), 1)
    assert closed == [] and waits == [] and len(session._mapped) == 2


def test_an_output_description_is_checked_once_per_run_and_only_when_identical() -> None:
    """The views of a run are kept by the description's every field (and the leaf it stands for);
    anything else, and any description that cannot be a key, is checked again."""
    from eval_server.judge.gpu_calls import GpuSession, Leaf

    session = GpuSession.__new__(GpuSession)  # no CUDA here: only the cache's bookkeeping
    session._views = {}
    checked: list[object] = []

    def checked_view(desc: object, leaf: Leaf) -> object:
        checked.append(desc)
        return ("view", len(checked))

    session._checked_view = checked_view  # type: ignore[method-assign]
    leaf, other = Leaf("out", None, (2,)), Leaf("out[1]", None, (2,))  # type: ignore[arg-type]
    desc = {"handle": "ab", "offset": 0, "dtype": "float32", "shape": [2]}
    first = session._view(desc, leaf)
    assert session._view(dict(desc), leaf) is first and len(checked) == 1
    session._view({**desc, "offset": 256}, leaf)
    session._view({**desc, "shape": [1, 2]}, leaf)
    session._view(desc, other)
    session._view({**desc, "shape": [[2]]}, leaf)  # unhashable: checked, never kept
    session._view({**desc, "shape": [[2]]}, leaf)
    session._view("not a dict", leaf)
    assert len(checked) == 7


def test_inputs_drawn_from_pythons_and_numpys_generators_are_reproducible_too() -> None:
    import torch

    from eval_server.pipeline import loader

    module = types.ModuleType("p")
    exec(
        "import random, numpy as np, torch\n"
        "def get_inputs():\n"
        "    return [torch.rand(4), random.randint(0, 10**9), torch.from_numpy(np.random.rand(3))]\n",
        module.__dict__,
    )
    first, again = (loader.make_input_sets(module, 77, torch.device("cpu"), 2) for _ in range(2))
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a[0], b[0]) and a[1] == b[1] and torch.equal(a[2], b[2])
    assert first[0][1] != first[1][1]


@pytest.mark.parametrize(
    ("candidate", "verdict"),
    [
        (
            "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n",
            "rejected",
        ),
        ("def broken(:\n", "compile_error"),
        (None, None),  # the bundled correct Triton candidate: the rules accept it, the runner goes on
        ("a" + "+a" * 20_000, None),  # the parser's RecursionError: the candidate's process meets it
        ("-" * 20_000 + "a", None),  # the parser's MemoryError: likewise
    ],
    ids=["static_rejection", "syntax_error", "accepted", "parser_recursion", "parser_memory"],
)
def test_the_judges_static_verdict_ends_only_what_the_rules_refuse(tmp_path, candidate, verdict) -> None:
    import torch

    from eval_server.judge.evaluate import static_verdict
    from eval_server.pipeline.context import EvalContext
    from eval_server.schema import parse_request

    source = candidate if candidate is not None else samples.load_candidate("relu__correct")
    request = parse_request({"reference": samples.load_problem("relu"), "candidate": source})
    ctx = EvalContext(torch.device("cpu"), "cpu", tmp_path, False)
    result = static_verdict(request, ctx)
    if verdict is None:
        assert result is None and "static" not in ctx.phases
        return
    assert result is not None and result.status == verdict and not result.correct
    assert "judge_static" in result.phases and result.feedback.startswith(f"Status: {verdict}.")
    if verdict == "rejected":
        assert "static.torch_compute" in {c.id for c in result.checks}
