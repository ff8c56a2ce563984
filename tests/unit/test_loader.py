"""Unit tests of eval_server.pipeline.loader: importing sources, seeded inputs, cloning, tracebacks."""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap

import pytest
import torch

from eval_server.pipeline import loader
from eval_server.pipeline.loader import (
    clone_args,
    format_exception_tail,
    import_source,
    make_init_inputs,
    make_inputs,
)

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")

PROBLEM = """\
import torch

class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)

    def forward(self, x):
        return self.lin(x)

def get_inputs():
    return [torch.randn(4, 8), (torch.rand(3), 2), 7]

def get_init_inputs():
    return [8]
"""


def kernel_modules() -> set[str]:
    return {name for name in sys.modules if name.startswith("_kernel_eval_")}


# --------------------------------------------------------------------------- import_source


def test_import_source_writes_file_and_imports(tmp_path):
    mod = import_source("X = 41 + 1\ndef f():\n    return X\n", tmp_path, "cand")
    assert (tmp_path / "cand.py").read_text() == "X = 41 + 1\ndef f():\n    return X\n"
    assert mod.X == 42 and mod.f() == 42
    assert mod.__file__ == str(tmp_path / "cand.py")
    assert mod.__name__.startswith("_kernel_eval_cand_")
    assert sys.modules[mod.__name__] is mod
    # Triton's JIT reads kernel source through inspect: it must be reachable from the file.
    assert inspect.getsource(mod.f) == "def f():\n    return X\n"


def test_import_source_unique_names_for_same_stem(tmp_path):
    a = import_source("V = 1\n", tmp_path, "same")
    b = import_source("V = 2\n", tmp_path, "same")
    assert a.__name__ != b.__name__
    assert (a.V, b.V) == (1, 2)
    assert (tmp_path / "same.py").read_text() == "V = 2\n"


def test_import_source_supports_dataclasses(tmp_path):
    src = "from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\n"
    mod = import_source(src, tmp_path, "dc")
    assert mod.P(3).x == 3


def test_syntax_error_propagates_and_module_is_unregistered(tmp_path):
    before = kernel_modules()
    with pytest.raises(SyntaxError) as info:
        import_source("def f(:\n    pass\n", tmp_path, "bad")
    assert info.value.filename == str(tmp_path / "bad.py")
    assert info.value.lineno == 1
    assert kernel_modules() == before


def test_body_exception_propagates_and_module_is_unregistered(tmp_path):
    before = kernel_modules()
    with pytest.raises(ZeroDivisionError):
        import_source("A = 1\nB = 1 / 0\n", tmp_path, "boom")
    assert kernel_modules() == before


def test_system_exit_in_body_propagates(tmp_path):
    before = kernel_modules()
    with pytest.raises(SystemExit):
        import_source("raise SystemExit(3)\n", tmp_path, "exit")
    assert kernel_modules() == before


# --------------------------------------------------------------------------- inputs


@pytest.fixture()
def problem(tmp_path):
    return import_source(PROBLEM, tmp_path, "reference")


def test_make_inputs_same_seed_same_inputs(problem):
    a = make_inputs(problem, 5, CPU)
    torch.randn(100)  # consuming the global generator in between must not matter
    b = make_inputs(problem, 5, CPU)
    assert isinstance(a, list) and len(a) == 3
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[1][0], b[1][0]) and isinstance(a[1], tuple) and a[1][1] == 2
    assert a[2] == 7


def test_make_inputs_different_seed_different_inputs(problem):
    a = make_inputs(problem, 5, CPU)
    b = make_inputs(problem, 6, CPU)
    assert not torch.equal(a[0], b[0])


def test_make_inputs_matches_manual_seed(problem):
    torch.manual_seed(11)
    expected = torch.randn(4, 8)
    assert torch.equal(make_inputs(problem, 11, CPU)[0], expected)


def test_inputs_are_created_on_the_device_not_copied(tmp_path):
    src = "import torch\nSEEN = []\ndef get_inputs():\n    x = torch.randn(2)\n    SEEN.append(x.device.type)\n    return [x]\n"
    mod = import_source(src, tmp_path, "devprobe")
    (x,) = make_inputs(mod, 0, torch.device("meta"))
    assert mod.SEEN == ["meta"]  # built under the default-device context
    assert x.device.type == "meta"
    assert torch.empty(1).device.type == "cpu"  # context restored


def test_make_init_inputs(problem, tmp_path):
    assert make_init_inputs(problem, 0, CPU) == [8]
    no_init = import_source("def get_inputs():\n    return []\n", tmp_path, "noinit")
    assert make_init_inputs(no_init, 0, CPU) == []


def test_build_model_is_seeded(problem):
    m1 = loader.build_model(problem.Model, [8], 3, CPU)
    m2 = loader.build_model(problem.Model, [8], 3, CPU)
    m3 = loader.build_model(problem.Model, [8], 4, CPU)
    assert torch.equal(m1.lin.weight, m2.lin.weight)
    assert not torch.equal(m1.lin.weight, m3.lin.weight)


# --------------------------------------------------------------------------- clone_args


def test_clone_args_clones_tensors_rebuilds_containers_shares_scalars():
    t = torch.randn(3, requires_grad=True)
    inner = torch.arange(4)
    marker = object()
    args = [t, (inner, 2.5, [inner]), 7, marker, "s"]
    out = clone_args(args)

    assert out is not args and len(out) == 5
    assert torch.equal(out[0], t) and out[0] is not t
    assert out[0].data_ptr() != t.data_ptr()
    assert not out[0].requires_grad  # detached
    assert type(out[1]) is tuple and out[1] is not args[1]
    assert out[1][0] is not inner and torch.equal(out[1][0], inner)
    assert type(out[1][2]) is list and out[1][2] is not args[1][2]
    assert out[1][2][0] is not inner
    assert out[1][1] == 2.5 and out[2] == 7
    assert out[3] is marker and out[4] is args[4]

    out[1][0].add_(100)  # writing the clone leaves the original alone
    assert torch.equal(inner, torch.arange(4))


def test_clone_args_keeps_strides_values():
    x = torch.randn(4, 6).t()
    (y,) = clone_args([x])
    assert torch.equal(x, y) and y.shape == (6, 4)


# --------------------------------------------------------------------------- format_exception_tail


def catch(fn, *args):
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no exception")


def test_traceback_drops_evaluator_frames_and_shortens_workdir(tmp_path):
    src = "def helper():\n    raise ValueError('bad value 42')\n\nhelper()\n"
    exc = catch(import_source, src, tmp_path, "candidate")
    text = format_exception_tail(exc, tmp_path)
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith("ValueError: bad value 42")
    assert 'File "candidate.py", line 4, in <module>' in text
    assert 'File "candidate.py", line 2, in helper' in text
    assert "raise ValueError('bad value 42')" in text
    assert str(tmp_path) not in text
    assert "eval_server" not in text and "in import_source" not in text
    # this test's own frame (outside the package) is kept
    assert "test_loader.py" in text


def test_traceback_drops_nn_module_call_plumbing(tmp_path):
    src = textwrap.dedent(
        """\
        import torch
        class ModelNew(torch.nn.Module):
            def forward(self, x):
                return x.missing_method()
        """
    )
    mod = import_source(src, tmp_path, "candidate")
    exc = catch(mod.ModelNew(), torch.ones(1))
    text = format_exception_tail(exc, tmp_path)
    assert "module.py" not in text and "_call_impl" not in text
    assert 'File "candidate.py", line 4, in forward' in text
    assert text.endswith("AttributeError: 'Tensor' object has no attribute 'missing_method'")


def test_traceback_shortens_site_packages_paths(tmp_path):
    code = compile(
        "def lib():\n    raise KeyError('k')\n",
        str(tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "somelib" / "core.py"),
        "exec",
    )
    ns: dict = {}
    exec(code, ns)
    text = format_exception_tail(catch(ns["lib"]), tmp_path / "evaluation-dir")
    assert 'File "somelib/core.py", line 2, in lib' in text
    assert "site-packages" not in text


def test_exception_without_traceback_has_no_header(tmp_path):
    text = format_exception_tail(RuntimeError("never raised"), tmp_path)
    assert text == "RuntimeError: never raised"


def test_syntax_error_shows_caret_and_short_path(tmp_path):
    exc = catch(import_source, "x = (1,\n", tmp_path, "candidate")
    text = format_exception_tail(exc, tmp_path)
    assert 'File "candidate.py", line 1' in text
    assert "SyntaxError" in text
    assert str(tmp_path) not in text


def test_long_traceback_trimmed_to_last_lines(tmp_path):
    src = "def rec(n):\n    if n == 0:\n        raise RuntimeError('deep end')\n    rec(n - 1)\n\nrec(60)\n"
    exc = catch(import_source, src, tmp_path, "candidate")
    text = format_exception_tail(exc, tmp_path, max_lines=10)
    lines = text.split("\n")
    assert lines[0] == "..."
    assert len(lines) == 11
    assert lines[-1] == "RuntimeError: deep end"


def test_long_traceback_trimmed_to_max_chars(tmp_path):
    exc = RuntimeError("x" * 500 + "TAIL")
    text = format_exception_tail(exc, tmp_path, max_chars=100)
    assert len(text) == 103
    assert text.startswith("...") and text.endswith("TAIL")


def test_syntax_error_from_ast_parse_has_no_evaluator_or_stdlib_frame(tmp_path):
    """The static phase's ast.parse: the model sees its line and caret, not evaluate.py or ast.py."""
    exc = catch(ast.parse, "def f(:\n    pass\n", "candidate.py")
    text = format_exception_tail(exc, tmp_path)
    assert "ast.py" not in text and "in parse" not in text
    assert 'File "candidate.py", line 1\n    def f(:\n' in text
    assert text.endswith("SyntaxError: invalid syntax")


def test_compile_error_feedback_of_a_real_evaluation_shows_only_the_candidate(tmp_path):
    """docs/EVAL_SERVER.md: evaluator frames removed; a syntax error's feedback is the model's line."""
    from eval_server.pipeline.context import EvalContext
    from eval_server.pipeline.evaluate import evaluate
    from eval_server.schema import EvalRequest

    reference = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    request = EvalRequest(reference=reference, candidate="class ModelNew(:\n    pass\n")
    ctx = EvalContext(device=torch.device("cpu"), device_label="cpu", workdir=tmp_path, timing_enabled=False)
    result = evaluate(request, ctx)
    assert result.status == "compile_error"
    for text in (result.error["traceback"], result.feedback):
        assert "ast.py" not in text and "evaluate.py" not in text and "Traceback" not in text
    assert 'File "candidate.py", line 1\n    class ModelNew(:\n' in result.feedback
