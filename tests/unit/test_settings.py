"""krl_common/settings.py: a settings dataclass read from a mapping, types from its annotations.

Each rule is checked on a small dataclass of its own, for the accepted value (and how it is
stored) and the refused one (and the message, which names the dotted key)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from krl_common.settings import parse_settings
from krl_common.validation import ValidationError

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Inner:
    depth: int = 1
    label: str | None = None


@dataclass(frozen=True)
class Outer:
    name: str  # required
    flag: bool = False
    count: int = 0
    rate: float = 1.0
    limit: float | None = None
    names: tuple[str, ...] = ()
    pair: tuple[int, str] = (0, "")
    ids: list[int] = field(default_factory=list)
    extras: Mapping[str, Any] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    mode: Literal["fast", "slow"] = "fast"
    key: int | str = 0
    inner: Inner = field(default_factory=Inner)
    maybe: Inner | None = None

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError("rate must be > 0")


def read(**data: Any) -> Outer:
    return parse_settings(Outer, {"name": "n", **data}, "root.sec")


def refused(message: str, **data: Any) -> None:
    with pytest.raises(ValidationError, match=message):
        read(**data)


def test_scalars_bool_is_not_a_number_and_a_number_is_not_a_bool() -> None:
    assert read(flag=True).flag is True
    refused(r"^root\.sec\.flag: expected bool, got int$", flag=1)
    refused(r"^root\.sec\.flag: expected bool, got str$", flag="yes")
    assert read(count=3).count == 3
    refused(r"^root\.sec\.count: expected int, got bool$", count=True)
    refused(r"^root\.sec\.count: expected int, got float$", count=1.5)
    refused(r"^root\.sec\.name: expected str, got int$", name=5)


def test_float_accepts_an_int_as_given_but_not_a_bool() -> None:
    cfg = read(rate=3)
    assert cfg.rate == 3 and type(cfg.rate) is int
    assert read(rate=0.5).rate == 0.5
    refused(r"^root\.sec\.rate: expected int or float, got bool$", rate=True)
    refused(r"^root\.sec\.rate: expected int or float, got str$", rate="1")


def test_optional_takes_none_and_otherwise_the_arm_type() -> None:
    assert read(limit=None).limit is None
    assert read(limit=2).limit == 2
    refused(r"^root\.sec\.limit: expected int or float, got str$", limit="2")


def test_union_of_several_types_names_them_all() -> None:
    assert read(key=3).key == 3 and read(key="a").key == "a"
    refused(r"^root\.sec\.key: expected int or str, got float$", key=1.5)


def test_sequences_are_read_from_lists_into_the_annotated_container() -> None:
    cfg = read(names=["a", "b"], ids=(1, 2), pair=[3, "x"])
    assert cfg.names == ("a", "b") and type(cfg.names) is tuple
    assert cfg.ids == [1, 2] and type(cfg.ids) is list
    assert cfg.pair == (3, "x")
    refused(r"^root\.sec\.names\[1\]: expected str, got int$", names=["a", 2])
    refused(r"^root\.sec\.names: expected list or tuple, got str$", names="a,b")
    refused(r"^root\.sec\.ids\[0\]: expected int, got bool$", ids=[True])
    refused(r"^root\.sec\.pair: expected 2 items, got 3$", pair=[1, "a", "b"])
    refused(r"^root\.sec\.pair\[1\]: expected str, got int$", pair=[1, 2])


def test_mappings_check_keys_and_values() -> None:
    cfg = read(extras={"top_k": 20, "stop": ["x"]}, weights={"a": 1, "b": 0.5})
    assert cfg.extras == {"top_k": 20, "stop": ["x"]} and cfg.weights == {"a": 1, "b": 0.5}
    refused(r"^root\.sec\.extras: expected dict, got list$", extras=[1])
    refused(r"^root\.sec\.weights\.b: expected int or float, got str$", weights={"a": 1, "b": "x"})
    refused(r"^root\.sec\.weights \(key 3\): expected str, got int$", weights={3: 1.0})


def test_literal() -> None:
    assert read(mode="slow").mode == "slow"
    refused(r"^root\.sec\.mode: expected one of \['fast', 'slow'\], got 'medium'$", mode="medium")


def test_nested_dataclasses_and_their_paths() -> None:
    cfg = read(inner={"depth": 3}, maybe={"label": "x"})
    assert cfg.inner == Inner(depth=3) and cfg.maybe == Inner(label="x")
    assert read(inner=None).inner == Inner()  # an empty YAML section: the nested defaults
    assert read(maybe=None).maybe is None  # optional: None stays None
    built = Inner(depth=7)
    assert read(inner=built).inner is built  # already built by the caller: kept
    refused(r"^root\.sec\.inner\.depth: expected int, got str$", inner={"depth": "3"})
    refused(r"^root\.sec\.maybe\.label: expected str, got int$", maybe={"label": 1})
    refused(
        r"^root\.sec\.inner: unknown field\(s\) \['deep'\]; allowed: \['depth', 'label'\]$", inner={"deep": 1}
    )
    refused(r"^root\.sec\.inner: expected dict, got int$", inner=5)


def test_unknown_missing_and_non_mapping() -> None:
    refused(r"^root\.sec: unknown field\(s\) \['cuont'\]", cuont=1)
    with pytest.raises(ValidationError, match=r"^root\.sec: missing required setting\(s\) \['name'\]$"):
        parse_settings(Outer, {"count": 1}, "root.sec")
    with pytest.raises(ValidationError, match=r"^root\.sec: missing required setting\(s\) \['name'\]$"):
        parse_settings(Outer, {"name": None}, "root.sec")  # null in YAML: not set
    with pytest.raises(ValidationError, match=r"^root\.sec: expected dict, got list$"):
        parse_settings(Outer, [("name", "n")], "root.sec")


def test_value_rules_of_post_init_name_the_section() -> None:
    refused(r"^root\.sec: rate must be > 0$", rate=0)


def test_base_keeps_the_values_not_given() -> None:
    base = Outer(name="b", count=4, rate=2.0)
    cfg = parse_settings(Outer, {"count": 5}, "root.sec", base=base)
    assert (cfg.name, cfg.count, cfg.rate) == ("b", 5, 2.0)
    assert parse_settings(Outer, {}, "root.sec", base=base) == base  # required fields come from base


def test_an_unsupported_annotation_is_a_programming_error() -> None:
    @dataclass
    class Odd:
        value: set[int] = field(default_factory=set)

    with pytest.raises(TypeError, match="not supported"):
        parse_settings(Odd, {"value": [1]}, "odd")
