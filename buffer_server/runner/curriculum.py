"""The curriculum: which KernelBench level the agent runner samples prompts from, easy -> hard.

It starts at the first level of `levels` (tier 0) and moves to the next tier when the rolling
rates of the current tier's level pass the thresholds: over the last `window` finished episodes
of that level (at least `min_episodes` of them), the share with a correct candidate in any turn
(`correct_rate`) is >= `advance_correct_rate` and the share with a correct candidate faster than
the reference (`fast_1`, speedup > 1) is >= `advance_fast_1` (None: not required; on CPU there
is no timing, so fast_1 is always 0 there).

- mode `advance`: tier k samples only `levels[k]`.
- mode `mix`: tier k samples `levels[k]` with probability `mix_new_level_weight` and the easier
  levels `levels[0..k-1]` evenly with the rest, so what was learnt keeps being rehearsed.

A tier whose levels have nothing left to run (all their epochs handed out) also advances
(reason `exhausted`); after the last tier the sampler is finished. Aborted episodes are not
outcomes (they say nothing about the model) and are not counted.

State (tier, rolling windows, history) is a JSON text that the runner persists in the buffer's
database after every outcome, so a restarted server resumes at the same tier with the same rates.
`PromptSampler` combines the curriculum with one `EpochQueue` per level (or one queue over all
prompts when the curriculum is off) and is what the runner asks for its next group.
"""

from __future__ import annotations

import collections
import json
import logging
import random
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from buffer_server.runner.scheduler import EpochQueue, GroupTask
from slime_ext.rollout.problems import PromptRecord

__all__ = ["CURRICULUM_MODES", "Curriculum", "CurriculumConfig", "PromptSampler", "episode_outcome"]

log = logging.getLogger("buffer_server.runner.curriculum")

CURRICULUM_MODES = ("advance", "mix")
STATE_VERSION = 1


@dataclass(frozen=True)
class CurriculumConfig:
    """The recipe's `curriculum` section (every field optional)."""

    enabled: bool = False
    levels: tuple[int, ...] | None = None  # tier order; None: the levels in the data, ascending
    mode: str = "advance"  # "advance" | "mix"
    window: int = 64  # rolling window of finished episodes per level
    min_episodes: int | None = None  # episodes of the level needed before advancing; None: window
    advance_correct_rate: float = 0.5
    advance_fast_1: float | None = 0.1  # None: fast_1 is not required
    mix_new_level_weight: float = 0.5  # mode mix: share of the newest level

    def __post_init__(self) -> None:
        # Types (levels: a list of integers, read as a tuple) are checked from the annotations
        # when the section is read (krl_common.settings.parse_settings); the value rules are here.
        if self.mode not in CURRICULUM_MODES:
            raise ValueError(f"mode must be one of {list(CURRICULUM_MODES)}, got {self.mode!r}")
        if self.levels is not None:
            if not self.levels or any(v < 1 for v in self.levels):
                raise ValueError(f"levels must be a non-empty list of integers >= 1, got {list(self.levels)}")
            if len(set(self.levels)) != len(self.levels):
                raise ValueError(f"levels must not repeat, got {list(self.levels)}")
        if self.window < 1:
            raise ValueError("window must be >= 1")
        if self.min_episodes is not None and not 1 <= self.min_episodes <= self.window:
            raise ValueError(f"min_episodes must be in [1, window={self.window}]")
        for name in ("advance_correct_rate", "advance_fast_1"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if not 0.0 < self.mix_new_level_weight <= 1.0:
            raise ValueError("mix_new_level_weight must be in (0, 1]")

    @property
    def needed_episodes(self) -> int:
        return self.window if self.min_episodes is None else self.min_episodes


def episode_outcome(turn_eval_results: Sequence[Mapping[str, Any] | None]) -> tuple[bool, bool]:
    """(correct, fast_1) of a finished episode from its turns' eval results: a correct candidate
    in any turn; a correct candidate with speedup > 1 in any turn."""
    correct = fast = False
    for result in turn_eval_results:
        if result and result.get("correct"):
            correct = True
            speedup = result.get("speedup")
            if isinstance(speedup, (int, float)) and speedup > 1.0:
                fast = True
    return correct, fast


class Curriculum:
    """Tier, rolling rates and the advance rule. Not thread-safe (the runner's loop owns it)."""

    def __init__(
        self, config: CurriculumConfig, levels: Sequence[int], state_json: str | None = None
    ) -> None:
        if not levels:
            raise ValueError("curriculum: no levels")
        self.config = config
        self.levels = list(levels)
        self.tier = 0
        self._windows: dict[int, collections.deque[tuple[bool, bool]]] = {
            lv: collections.deque(maxlen=config.window) for lv in self.levels
        }
        self._totals: dict[int, int] = dict.fromkeys(self.levels, 0)
        self.history: list[dict[str, Any]] = []
        if state_json:
            self._load(state_json)

    # ------------------------------------------------------------------ state

    def _load(self, state_json: str) -> None:
        try:
            state = json.loads(state_json)
            if state.get("version") != STATE_VERSION:
                raise ValueError(f"state version {state.get('version')!r} != {STATE_VERSION}")
            if [int(v) for v in state["levels"]] != self.levels:
                log.warning(
                    "curriculum levels changed (%s -> %s): starting again at tier 0",
                    state["levels"],
                    self.levels,
                )
                return
            self.tier = min(int(state["tier"]), len(self.levels) - 1)
            for key, outcomes in state["windows"].items():
                for correct, fast in outcomes:
                    self._windows[int(key)].append((bool(correct), bool(fast)))
            self._totals.update({int(k): int(v) for k, v in state["totals"].items()})
            self.history = list(state["history"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"curriculum: stored state is not usable ({exc}); delete it or fix it") from None

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": STATE_VERSION,
                "levels": self.levels,
                "tier": self.tier,
                "windows": {str(lv): [list(o) for o in w] for lv, w in self._windows.items()},
                "totals": {str(lv): n for lv, n in self._totals.items()},
                "history": self.history,
            },
            separators=(",", ":"),
        )

    # ------------------------------------------------------------------ sampling weights

    @property
    def current_level(self) -> int:
        return self.levels[self.tier]

    @property
    def last_tier(self) -> bool:
        return self.tier + 1 >= len(self.levels)

    def weights(self) -> dict[int, float]:
        """Level -> probability for the current tier (sums to 1)."""
        if self.config.mode == "advance" or self.tier == 0:
            return {self.current_level: 1.0}
        new = self.config.mix_new_level_weight
        easier = self.levels[: self.tier]
        return {**dict.fromkeys(easier, (1.0 - new) / len(easier)), self.current_level: new}

    # ------------------------------------------------------------------ outcomes

    def rates(self, level: int) -> dict[str, Any]:
        window = self._windows[level]
        n = len(window)
        return {
            "window_episodes": n,
            "total_episodes": self._totals[level],
            "correct_rate": round(sum(c for c, _ in window) / n, 4) if n else None,
            "fast_1": round(sum(f for _, f in window) / n, 4) if n else None,
        }

    def record(self, level: int, correct: bool, fast_1: bool) -> bool:
        """Count one finished episode of `level`; returns True if the tier advanced."""
        if level not in self._windows:
            return False
        self._windows[level].append((bool(correct), bool(fast_1)))
        self._totals[level] += 1
        if level == self.current_level and not self.last_tier and self._passed():
            self.advance("thresholds")
            return True
        return False

    def _passed(self) -> bool:
        cfg = self.config
        window = self._windows[self.current_level]
        n = len(window)
        if n < cfg.needed_episodes:
            return False
        if sum(c for c, _ in window) / n < cfg.advance_correct_rate:
            return False
        return cfg.advance_fast_1 is None or sum(f for _, f in window) / n >= cfg.advance_fast_1

    def advance(self, reason: str) -> None:
        if self.last_tier:
            return
        rates = self.rates(self.current_level)
        self.tier += 1
        self.history.append(
            {
                "tier": self.tier,
                "level": self.current_level,
                "reason": reason,
                "at": time.time(),
                "previous": rates,
            }
        )
        log.info(
            "curriculum: tier %d (level %d), reason %s, previous level %s",
            self.tier,
            self.current_level,
            reason,
            rates,
        )

    def stats(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "enabled": True,
            "mode": cfg.mode,
            "tier": self.tier,
            "level": self.current_level,
            "levels": self.levels,
            "weights": {str(lv): round(w, 4) for lv, w in self.weights().items()},
            "rates": {str(lv): self.rates(lv) for lv in self.levels},
            "thresholds": {
                "window": cfg.window,
                "min_episodes": cfg.needed_episodes,
                "correct_rate": cfg.advance_correct_rate,
                "fast_1": cfg.advance_fast_1,
            },
            "history": self.history[-10:],
        }


class PromptSampler:
    """The runner's source of groups: the curriculum picks a level, the level's EpochQueue picks
    the prompt. Without a curriculum, one EpochQueue over every prompt."""

    def __init__(
        self,
        prompts: Sequence[PromptRecord],
        *,
        group_size: int,
        epochs: int,
        seed: int | None,
        done: Callable[[int, str], set[int]] | None = None,
        curriculum: CurriculumConfig | None = None,
        state_json: str | None = None,
    ) -> None:
        if not prompts:
            raise ValueError("no prompts to run")
        self.excluded: dict[int, int] = {}
        self.curriculum: Curriculum | None = None
        self._rng = random.Random(f"{seed}:levels")
        kw = {"group_size": group_size, "epochs": epochs, "seed": seed, "done": done}
        if curriculum is None or not curriculum.enabled:
            self.queues = {0: EpochQueue(prompts, **kw)}
            return
        present = sorted({p.level for p in prompts})
        levels = list(curriculum.levels) if curriculum.levels is not None else present
        for p in prompts:
            if p.level not in levels:
                self.excluded[p.level] = self.excluded.get(p.level, 0) + 1
        if self.excluded:
            log.warning(
                "curriculum: prompts of levels %s are not in curriculum.levels and are not run", self.excluded
            )
        self.queues = {
            lv: EpochQueue([p for p in prompts if p.level == lv], salt=f"level{lv}", **kw) for lv in levels
        }
        self.curriculum = Curriculum(curriculum, levels, state_json)

    @property
    def epoch(self) -> int:
        """The lowest epoch still being handed out (epochs when all are done)."""
        return min(q.epoch for q in self.queues.values())

    @property
    def finished(self) -> bool:
        """No group will come any more."""
        cur = self.curriculum
        if cur is None:
            return self.queues[0].exhausted
        return cur.last_tier and all(self.queues[lv].exhausted for lv in cur.weights())

    def next(self, blocked: Container[str] = ()) -> GroupTask | None:
        """The next group to run, or None (finished, or every candidate instance is blocked)."""
        cur = self.curriculum
        if cur is None:
            return self.queues[0].next(blocked)
        while True:
            live = {lv: w for lv, w in cur.weights().items() if not self.queues[lv].exhausted}
            if live:
                break
            if cur.last_tier:
                return None
            cur.advance("exhausted")
        levels = list(live)
        first = self._rng.choices(levels, weights=[live[lv] for lv in levels])[0]
        for lv in [first] + [lv for lv in levels if lv != first]:
            task = self.queues[lv].next(blocked)
            if task is not None:
                return task
        return None

    def record(self, level: int, correct: bool, fast_1: bool) -> bool:
        """A finished episode's outcome (curriculum only); True if the tier advanced."""
        return self.curriculum.record(level, correct, fast_1) if self.curriculum else False

    def stats(self) -> dict[str, Any]:
        queues = {
            str(lv): {
                "epoch": q.epoch,
                "remaining_in_epoch": q.remaining_in_epoch,
                "exhausted": q.exhausted,
                "prompts": len(q.prompts),
                "skipped_groups": q.skipped_groups,
                "resumed_groups": q.resumed_groups,
            }
            for lv, q in self.queues.items()
        }
        out: dict[str, Any] = {"epoch": self.epoch, "finished": self.finished}
        if self.curriculum is None:
            out["queue"] = queues["0"]
            out["curriculum"] = {"enabled": False}
        else:
            out["queues"] = queues
            out["curriculum"] = {**self.curriculum.stats(), "excluded_prompts_by_level": self.excluded}
        return out
