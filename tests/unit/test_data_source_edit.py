"""AST-located source edits: renames touch identifiers only, everything else stays byte for byte."""

from __future__ import annotations

import pytest

from slime_ext.data.source_edit import Edit, apply_edits, rename_identifier

pytestmark = pytest.mark.unit

SRC = '''import torch  # FooNew lives here
import torch.nn as nn


@some.decorator(FooNew="kw")
class FooNew(nn.Module):
    """FooNew keeps its docstring."""

    def __init__(self):
        super(FooNew, self).__init__()
        self.FooNew = "FooNew"

    def forward(self, x):  # é unicode before: FooNew
        return x


async def helper():
    return FooNew()


def FooNewer():
    return [FooNew, FooNewer]
'''


def test_rename_only_identifiers():
    out = rename_identifier(SRC, "FooNew", "ModelNew")
    assert "class ModelNew(nn.Module):" in out
    assert "super(ModelNew, self).__init__()" in out
    assert "return ModelNew()" in out and "return [ModelNew, FooNewer]" in out
    # attributes, keywords, strings, comments, docstrings and longer names are untouched
    assert 'self.FooNew = "FooNew"' in out
    assert '@some.decorator(FooNew="kw")' in out
    assert "# FooNew lives here" in out and "# é unicode before: FooNew" in out
    assert '"""FooNew keeps its docstring."""' in out and "def FooNewer():" in out
    # nothing else changed: undoing the rename gives the original back
    assert rename_identifier(out, "ModelNew", "FooNew") == SRC


def test_rename_functions_and_non_ascii_columns():
    src = 'x = "ü"; y = f(x)\ndef f(a):\n    return a\n'
    assert rename_identifier(src, "f", "g") == 'x = "ü"; y = g(x)\ndef g(a):\n    return a\n'
    assert rename_identifier("async def f():\n    pass\n", "f", "g") == "async def g():\n    pass\n"


def test_rename_refuses_clash():
    with pytest.raises(ValueError, match="'Model' is already used"):
        rename_identifier("class Model: pass\nclass Foo(Model): pass\n", "Foo", "Model")


def test_apply_edits_rejects_overlap():
    assert apply_edits("abcdef", [Edit(4, 6, "Z"), Edit(0, 1, "X")]) == "XbcdZ"
    with pytest.raises(ValueError, match="overlapping"):
        apply_edits("abcdef", [Edit(0, 3, "X"), Edit(2, 4, "Y")])
