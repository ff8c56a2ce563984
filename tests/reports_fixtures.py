"""Hand-made per-sample results for the report tests (metrics, compare, report)."""

from __future__ import annotations

from slime_ext.reports.results import SampleResult, TurnResult

__all__ = ["sample"]

# status -> compiled flag for fixture turns
_COMPILED = {"ok": True, "incorrect": True, "runtime_error": True}


def sample(
    instance_id: str,
    idx: int,
    turns: list[tuple[str, float | None]],
    *,
    level: int = 1,
    status: str = "completed",
    split: str = "holdout",
    config_id: str = "cfg",
    model: str = "m",
    problem_hash: str | None = None,
) -> SampleResult:
    """A result whose turns are (status, speedup) pairs; status "ok" is correct."""
    return SampleResult(
        instance_id=instance_id,
        problem_id=instance_id,
        level=level,
        name=instance_id,
        split=split,
        problem_hash=problem_hash or f"hash-{instance_id}",
        sample=idx,
        model=model,
        config_id=config_id,
        status=status,
        turns=tuple(
            TurnResult(
                turn=i,
                status=st,
                compiled=_COMPILED.get(st, False),
                correct=st == "ok",
                speedup=sp,
                finish_reason="stop",
            )
            for i, (st, sp) in enumerate(turns)
        ),
    )
