"""Unit tests of eval_server.checks.static: each rule on minimal positive and clean examples."""

from __future__ import annotations

import ast
import sys
import textwrap

import pytest

from eval_server.checks.static import RULE_IDS, RULES, run_static_checks
from eval_server.samples import load_candidate
from eval_server.schema import Check

pytestmark = pytest.mark.unit

# A legitimate candidate: kernel, launch, allocation and views only.
CLEAN = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=m), 0.0), mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous().view(-1)
        y = torch.empty_like(x)
        k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y.reshape(x.shape)
"""


def checks(source: str) -> list[Check]:
    return run_static_checks(ast.parse(textwrap.dedent(source)))


def fired(source: str) -> dict[str, str]:
    return {c.id: c.message for c in checks(source)}


def with_kernel(body: str) -> str:
    """CLEAN plus `body` appended at module level (so only the rule under test can fire)."""
    return CLEAN + "\n" + textwrap.dedent(body)


def line_of(source: str, needle: str) -> int:
    for i, line in enumerate(source.splitlines(), start=1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in source")


def test_rule_ids_are_stable():
    assert RULE_IDS == (
        "static.no_triton_kernel",
        "static.try_except",
        "static.reference_model",
        "static.torch_compute",
        "static.process_escape",
        "static.forbidden_api",
        "static.file_access",
    )
    assert all(r.severity == "reject" for r in RULES)


def test_clean_candidate_fires_nothing():
    assert checks(CLEAN) == []


@pytest.mark.parametrize("name", ["relu__correct", "gemm_scale_leakyrelu__correct"])
def test_bundled_correct_candidates_fire_nothing(name):
    assert checks(load_candidate(name)) == []


# --------------------------------------------------------------------------- no_triton_kernel


def test_no_jit_kernel_fires():
    src = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.clone()\n"
    got = checks(src)
    assert [c.id for c in got] == ["static.no_triton_kernel"]
    assert got[0].severity == "reject"
    assert got[0].message.endswith("Found: no function decorated with @triton.jit.")
    assert "@triton.jit" in got[0].message


@pytest.mark.parametrize(
    "decorator, imports",
    [
        ("@triton.jit", "import triton"),
        ("@triton.jit(do_not_specialize=['n'])", "import triton"),
        ("@jit", "from triton import jit"),
        ("@triton.autotune(configs=[], key=['n'])\n@triton.jit", "import triton"),
    ],
)
def test_jit_decorator_forms_are_recognised(decorator, imports):
    src = f"{imports}\n{decorator}\ndef k(x):\n    pass\n"
    assert "static.no_triton_kernel" not in fired(src)


def test_undecorated_function_named_like_kernel_is_not_a_kernel():
    assert "static.no_triton_kernel" in fired("import triton\ndef relu_kernel(x):\n    pass\n")


# --------------------------------------------------------------------------- try_except


def test_try_except_fires_with_line():
    src = with_kernel(
        """
        def helper(x):
            try:
                return x
            except Exception:
                return None
        """
    )
    got = fired(src)
    assert set(got) == {"static.try_except"}
    assert f"Found: line {line_of(src, 'try:')}: try/except." in got["static.try_except"]


@pytest.mark.parametrize(
    "imports, call",
    [("import contextlib", "contextlib.suppress"), ("from contextlib import suppress as quiet", "quiet")],
)
def test_suppress_is_a_try_except_too(imports, call):
    src = with_kernel(
        f"""
        {imports}
        def helper(x):
            with {call}(Exception):
                return x
            return None
        """
    )
    got = fired(src)
    assert set(got) == {"static.try_except"}
    assert f"Found: line {line_of(src, 'with ')}: contextlib.suppress." in got["static.try_except"]


def test_try_finally_without_handler_is_allowed():
    src = with_kernel(
        """
        def helper(x):
            try:
                return x
            finally:
                pass
        """
    )
    assert fired(src) == {}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="except* needs Python 3.11")
def test_try_star_fires():
    src = with_kernel(
        """
        def helper(x):
            try:
                return x
            except* ValueError:
                pass
        """
    )
    assert "static.try_except" in fired(src)


def test_many_hits_are_capped_at_five():
    blocks = "".join("try:\n    pass\nexcept Exception:\n    pass\n" for _ in range(7))
    msg = fired(with_kernel(blocks))["static.try_except"]
    evidence = msg.split(" Found: ", 1)[1]
    assert evidence.count(": try/except") == 5
    first = len(CLEAN.splitlines()) + 2  # CLEAN, one blank line, then the blocks (4 lines each)
    assert evidence == "; ".join(f"line {first + 4 * i}: try/except" for i in range(5)) + " ...."


# --------------------------------------------------------------------------- reference_model


def test_class_modelnew_inherits_model():
    src = with_kernel(
        """
        class Model(nn.Module):
            def forward(self, x):
                return x

        class ModelNew2(Model):
            pass
        """
    )
    msg = fired(src)["static.reference_model"]
    n_def = line_of(src, "class Model(")
    n_sub = line_of(src, "class ModelNew2(Model)")
    assert f"line {n_def}: defines class Model (a copy of the reference)" in msg
    assert f"line {n_sub}: class ModelNew2 inherits from Model" in msg
    assert f"line {n_sub}: uses the name Model" in msg


def test_class_modelnew_model_alone():
    src = "import triton\n@triton.jit\ndef k(x):\n    pass\nclass ModelNew(Model):\n    pass\n"
    got = fired(src)
    assert set(got) == {"static.reference_model"}
    assert "line 5: class ModelNew inherits from Model" in got["static.reference_model"]


def test_dotted_model_base_and_import_and_call():
    src = with_kernel(
        """
        from reference import Model
        import reference

        class A(reference.Model):
            pass

        def make():
            return Model()
        """
    )
    msg = fired(src)["static.reference_model"]
    assert f"line {line_of(src, 'from reference import Model')}: imports Model" in msg
    assert f"line {line_of(src, 'class A(')}: class A inherits from Model" in msg
    assert f"line {line_of(src, 'return Model()')}: uses the name Model" in msg


def test_modelnew_and_model_in_strings_are_fine():
    src = with_kernel('NAME = "Model"\nclass ModelNewHelper(nn.Module):\n    pass\n')
    assert fired(src) == {}


# --------------------------------------------------------------------------- torch_compute


@pytest.mark.parametrize(
    "imports, call, shown",
    [
        ("", "torch.relu(x)", "torch.relu()"),
        ("", "torch.matmul(x, x)", "torch.matmul()"),
        ("", "torch.nn.functional.gelu(x)", "torch.nn.functional.gelu()"),
        ("import torch.nn.functional as F", "F.relu(x)", "F.relu()"),
        ("from torch.nn import functional as Fn", "Fn.softmax(x, dim=-1)", "Fn.softmax()"),
        ("from torch.nn import functional", "functional.linear(x, x)", "functional.linear()"),
        ("", "torch.compile(f)", "torch.compile()"),
    ],
)
def test_torch_compute_calls_fire(imports, call, shown):
    src = with_kernel(f"{imports}\ndef helper(x, f):\n    return {call}\n")
    msg = fired(src)["static.torch_compute"]
    assert f"line {line_of(src, call)}: {shown}" in msg
    assert "move the math into @triton.jit kernels" in msg


def test_matmul_operator_fires():
    src = with_kernel("def helper(a, b):\n    return a @ b\n")
    msg = fired(src)["static.torch_compute"]
    assert f"line {line_of(src, 'a @ b')}: the @ operator (torch matmul)" in msg


def test_allocation_views_and_unaliased_names_do_not_fire():
    src = with_kernel(
        """
        import math

        def helper(x):
            a = torch.empty((4, 4), device=x.device)
            b = torch.zeros_like(x).view(-1).reshape(2, -1).contiguous()
            c = torch.empty_strided((2,), (1,))
            return math.tanh(1.0), a, b, c, x.size(0), x.stride()
        """
    )
    assert fired(src) == {}


def test_same_name_on_other_modules_is_not_torch():
    src = with_kernel("import math as np\ndef helper(x):\n    return np.tanh(x), tl.sigmoid(x), G.relu(x)\n")
    assert fired(src) == {}


# --------------------------------------------------------------------------- process_escape


@pytest.mark.parametrize(
    "stmt, evidence",
    [
        ("import threading", "import threading"),
        ("import multiprocessing.pool", "import multiprocessing.pool"),
        ("import subprocess as sp", "import subprocess"),
        ("from concurrent.futures import ThreadPoolExecutor", "from concurrent.futures import ..."),
        ("s = torch.cuda.Stream()", "torch.cuda.Stream()"),
        ("ctx = torch.cuda.stream(None)", "torch.cuda.stream()"),
    ],
)
def test_process_escape_fires(stmt, evidence):
    src = with_kernel(stmt + "\n")
    got = fired(src)
    assert set(got) == {"static.process_escape"}
    assert f"line {line_of(src, stmt)}: {evidence}" in got["static.process_escape"]


def test_harmless_imports_do_not_fire_process_escape():
    src = with_kernel("import math\nimport os.path\nfrom typing import Any\nimport threadpoolctl_like\n")
    assert fired(src) == {}


# --------------------------------------------------------------------------- combination


def test_several_rules_fire_in_rule_order_one_check_each():
    src = "import threading\nimport torch\ntry:\n    y = torch.relu(1)\nexcept Exception:\n    pass\n"
    got = checks(src)
    assert [c.id for c in got] == [
        "static.no_triton_kernel",
        "static.try_except",
        "static.torch_compute",
        "static.process_escape",
    ]
    by_id = {c.id: c.message for c in got}
    assert "Found: line 3: try/except." in by_id["static.try_except"]
    assert "Found: line 4: torch.relu()." in by_id["static.torch_compute"]
    assert "Found: line 1: import threading." in by_id["static.process_escape"]


# --------------------------------------------------------------------------- forbidden_api


@pytest.mark.parametrize(
    "stmt, evidence",
    [
        ("import numpy as np", "import numpy"),
        ("from scipy import special", "from scipy import"),
        ("import ctypes", "import ctypes"),
        ("import inspect", "import inspect"),
        ("x = torch._C._get_tracing_state()", "._C"),
        ("from torch.utils._python_dispatch import _disable_current_modes", "_disable_current_modes"),
        ("t = __import__('threading')", "__import__"),
        ("v = out.cpu().numpy()", ".numpy()"),
        ("v = out.tolist()", ".tolist()"),
        ("f = sys._getframe(1)", "._getframe"),
    ],
)
def test_forbidden_api_fires(stmt, evidence):
    msg = fired(with_kernel(stmt + "\n"))["static.forbidden_api"]
    assert evidence in msg


def test_forbidden_api_allows_plain_math_and_os():
    assert "static.forbidden_api" not in fired(with_kernel("import math\nimport os\ny = math.sqrt(2.0)\n"))


# Every way of reaching a module (gc finds the reference's outputs) without an import statement.
@pytest.mark.parametrize(
    "stmt, evidence",
    [
        ('import sys\ng = sys.modules["g" + "c"]', "sys.modules (the module table"),
        ('import sys\ng = sys.modules.get("gc")', "sys.modules (the module table"),
        ("import sys as s\nt = s.modules", "s.modules (the module table"),
        ("from sys import modules", "import of modules"),
        ("from os import sys", "import of sys"),
        ('g = torch.sys.modules["gc"]', ".sys (reaches"),
        ('import builtins\ng = getattr(builtins, "__imp" + "ort__")("gc")', "import builtins"),
        ('import builtins\ng = builtins.__import__("gc")', ".__import__ (reaches"),
        ('g = __import__("g" + "c")', "__import__ (imports"),
        ('imp = __import__\ng = imp("gc")', "__import__ (imports"),
        ('import importlib\nim = importlib.import_module\ng = im("g" + "c")', "import importlib"),
        ('from importlib import import_module as f\ng = f("gc")', "from importlib import"),
        ('g = __builtins__["__import__"]("gc")', "__builtins__ (imports"),
        ("g = eval(\"__import__('gc')\")", "eval (imports"),
        ('e = eval\ng = e("1")', "eval (imports"),
        ('exec("import gc")', "exec (imports"),
        ('c = compile("import gc", "<s>", "exec")', "compile (imports"),
        ('g = globals()["__builtins__"]', "globals (imports"),
        ('g = vars(torch)["sys"]', "vars (imports"),
        ("g = locals()", "locals (imports"),
        ('name = "re" + "lu"\nf = getattr(torch, name)', "getattr() with a computed attribute name"),
        ('setattr(torch, "s" + "ync", None)', "setattr() with a computed attribute name"),
        ('m = getattr(torch, "sys")', "getattr(..., 'sys')"),
        ('m = getattr(sys, "modules")', "getattr(..., 'modules')"),
        ("d = torch.__dict__", ".__dict__ (reaches"),
        ("g = (lambda: 0).__globals__", ".__globals__ (reaches"),
        ("c = triton.JITFunction.run.__closure__[0].cell_contents", ".__closure__ (reaches"),
        ("s = object.__subclasses__()", ".__subclasses__ (reaches"),
        ("f = (x for x in ()).gi_frame.f_back", ".f_back (reaches"),
        ("from operator import attrgetter", "import of attrgetter"),
        ('import pickle\ng = pickle.loads(b"cgc\\ncollect\\n.")', "import pickle"),
        ("import marshal", "import marshal"),
        ("import runpy", "import runpy"),
    ],
)
def test_forbidden_api_fires_on_dynamic_module_access(stmt, evidence):
    msg = fired(with_kernel(stmt + "\n"))["static.forbidden_api"]
    assert evidence in msg, msg
    assert "reaches modules by name" in msg  # the rule's message says what is wrong and what to do


@pytest.mark.parametrize(
    "body",
    [
        "import triton.language as tl2\nfrom triton.language import constexpr\n",
        "import math\ny = math.sqrt(2.0) + math.prod([2, 3])\n",
        "import sys\nBIG = sys.maxsize\n",  # importing sys is fine; its module table is not
        "from sys import maxsize\n",
        "import os\nn = os.cpu_count()\n",
        "f = getattr(torch, 'float32')\nh = hasattr(torch, 'cuda')\n",  # literal names stay allowed
        "class M(nn.Module):\n    def count(self):\n        return len(list(self.modules()))\n",
        "y = torch.empty((4, 4), dtype=torch.float32).view(-1)\n",
    ],
)
def test_forbidden_api_allows_ordinary_triton_torch_and_math(body):
    assert "static.forbidden_api" not in fired(with_kernel(body)), fired(with_kernel(body))


def test_corpus_bypass_cases_are_caught_statically():
    """Every gc_via_* corpus file fires static.forbidden_api before anything runs."""
    from tests.exploit_cases import EXPLOIT_CASES

    cases = [c for c in EXPLOIT_CASES if c.name.startswith("gc_via_")]
    assert len(cases) >= 11
    for case in cases:
        assert "static.forbidden_api" in fired(case.candidate_source()), case.name


@pytest.mark.parametrize(
    "source",
    [
        'f = open(5, "w")\nf.write("{}")\nf.close()',
        "import os\nos.write(5, b'{}')",
        "import os as o\no.close(5)",
        "from os import dup2",
        "import pathlib\npathlib.Path('/proc/self/fd/5').write_text('{}')",
        "import socket",
        "import signal",
        "import io\nio.FileIO(5, 'w')",
    ],
)
def test_file_and_descriptor_access_is_rejected(source: str) -> None:
    assert "static.file_access" in [c.id for c in checks(CLEAN + "\n" + source + "\n")]


def test_environment_paths_and_exit_stay_allowed() -> None:
    ok = CLEAN + "\nimport os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'\nP = os.path.join('a', 'b')\n"
    assert "static.file_access" not in [c.id for c in checks(ok)]
