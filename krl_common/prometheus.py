"""Prometheus text exposition without a client library: one metric family at a time."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def family(
    name: str, help_text: str, kind: str, samples: Iterable[tuple[dict[str, str] | None, Any]]
) -> list[str]:
    """HELP and TYPE lines, then one `name{label="v"} value` line per (labels, value) sample."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        tag = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
        lines.append(f"{name}{tag} {value}")
    return lines


def scalars(kind: str, metrics: dict[str, tuple[str, Any]]) -> list[str]:
    """Several unlabelled metrics of one kind: {name: (help text, value)}."""
    lines: list[str] = []
    for name, (help_text, value) in metrics.items():
        lines += family(name, help_text, kind, [(None, value)])
    return lines


def render(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"
