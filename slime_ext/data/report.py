"""What a data-preparation run kept and dropped, and why: counts per reason with a few row keys
each, as JSON (written beside the output) and as a printed table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FilterReport"]

_EXAMPLES_PER_REASON = 5


@dataclass
class FilterReport:
    rows: int = 0  # rows read
    kept: int = 0  # single-turn examples written
    multi_turn: int = 0  # multi-turn examples written
    dropped: Counter[str] = field(default_factory=Counter)  # reason -> rows dropped
    multi_turn_skipped: Counter[str] = field(default_factory=Counter)  # reason -> attempts not used
    examples: dict[str, list[str]] = field(default_factory=dict)  # reason -> first row keys
    details: dict[str, str] = field(default_factory=dict)  # reason -> first detail message
    settings: dict[str, Any] = field(default_factory=dict)

    def _note(self, reason: str, key: str, detail: str) -> None:
        keys = self.examples.setdefault(reason, [])
        if len(keys) < _EXAMPLES_PER_REASON:
            keys.append(key)
        if detail and reason not in self.details:
            self.details[reason] = detail[:300]

    def drop(self, reason: str, key: str, detail: str = "") -> None:
        self.dropped[reason] += 1
        self._note(reason, key, detail)

    def skip_attempt(self, reason: str, key: str, detail: str = "") -> None:
        self.multi_turn_skipped[reason] += 1
        self._note(f"attempt:{reason}", key, detail)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "kept_single_turn": self.kept,
            "multi_turn": self.multi_turn,
            "dropped_total": sum(self.dropped.values()),
            "dropped": dict(self.dropped.most_common()),
            "multi_turn_skipped": dict(self.multi_turn_skipped.most_common()),
            "example_keys": self.examples,
            "first_detail": self.details,
            "settings": self.settings,
        }

    def table(self) -> str:
        """Plain-text table: one line per reason, biggest first."""
        lines = [f"{'rows read':<40} {self.rows:>8}"]
        for reason, n in self.dropped.most_common():
            lines.append(f"{'  dropped: ' + reason:<40} {n:>8}")
        lines.append(f"{'single-turn examples':<40} {self.kept:>8}")
        for reason, n in self.multi_turn_skipped.most_common():
            lines.append(f"{'  attempt not used: ' + reason:<40} {n:>8}")
        lines.append(f"{'multi-turn examples':<40} {self.multi_turn:>8}")
        return "\n".join(lines)
