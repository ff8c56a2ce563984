"""Standard JSON only: the shared encoder (`fastjson.finite` / `dumps_text` / `dumps`) and the Flask
provider of both HTTP services write non-finite floats as null, never NaN/Infinity."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from krl_common import fastjson
from krl_common.http_json import json_flask_app

pytestmark = pytest.mark.unit


def strict_loads(text: str | bytes):
    """json.loads that rejects the non-standard NaN / Infinity / -Infinity literals."""

    def raise_error(name: str):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=raise_error)


NESTED = {
    "nan": math.nan,
    "inf": math.inf,
    "ninf": -math.inf,
    "ok": 1.5,
    "int": 3,
    "list": [1.0, math.nan, [math.inf, {"deep": -math.inf}], (2.0, math.nan)],
    "np": [np.float64("inf"), np.float32("nan"), np.float64(-math.inf)],
    "str": "Infinity",
    "none": None,
    "bool": True,
}
EXPECTED = {
    "nan": None,
    "inf": None,
    "ninf": None,
    "ok": 1.5,
    "int": 3,
    "list": [1.0, None, [None, {"deep": None}], [2.0, None]],
    "np": [None, None, None],
    "str": "Infinity",
    "none": None,
    "bool": True,
}


def test_finite_replaces_every_non_finite_float_at_any_depth() -> None:
    assert fastjson.finite(NESTED) == EXPECTED
    assert NESTED["nan"] != NESTED["nan"]  # the input is not modified
    clean = {"a": [1.0, 2], "b": {"c": "x"}}
    assert fastjson.finite(clean) is clean  # nothing to replace: no copy
    finite_np = np.float32(2.5)
    assert fastjson.finite(finite_np) is finite_np


def test_dumps_text_is_strict_and_keeps_json_dumps_arguments() -> None:
    with_np = {k: v for k, v in NESTED.items() if k != "np"}  # the stdlib cannot encode numpy scalars
    text = fastjson.dumps_text(with_np, sort_keys=True, separators=(",", ":"))
    assert strict_loads(text) == {k: v for k, v in EXPECTED.items() if k != "np"}
    assert list(strict_loads(text)) == sorted(with_np)
    assert fastjson.dumps_text({"a": 1.0}) == json.dumps({"a": 1.0})  # same output when clean
    # what a `default` fallback returns is made finite too
    assert strict_loads(fastjson.dumps_text({"x": object()}, default=lambda o: [math.inf])) == {"x": [None]}
    with pytest.raises(TypeError):  # unencodable values still fail as json.dumps does
        fastjson.dumps_text({"x": object()})


def test_dumps_writes_null_for_non_finite_floats_on_either_backend(monkeypatch) -> None:
    plain = {k: v for k, v in NESTED.items() if k != "np"}
    want = {k: v for k, v in EXPECTED.items() if k != "np"}
    assert strict_loads(fastjson.dumps(plain)) == want  # whichever backend is installed
    monkeypatch.setattr(fastjson, "_orjson", None)  # the standard-library fallback
    assert strict_loads(fastjson.dumps(plain)) == want
    assert fastjson.dumps({"a": "é", "b": [1, 2.5]}) == '{"a":"é","b":[1,2.5]}'.encode()


def test_flask_json_replies_of_both_services_are_strict() -> None:
    app = json_flask_app("strict-test", 1 << 10)

    @app.get("/inf")
    def inf_route():
        from flask import jsonify

        return jsonify(max_abs_diff=math.inf, rel=math.nan, lp=[-math.inf, -0.5])

    client = app.test_client()
    reply = client.get("/inf")
    assert reply.status_code == 200 and reply.mimetype == "application/json"
    assert strict_loads(reply.get_data()) == {"max_abs_diff": None, "rel": None, "lp": [None, -0.5]}
    missing = client.get("/nope")  # the JSON error handler goes through the same provider
    assert missing.status_code == 404 and "error" in strict_loads(missing.get_data())
