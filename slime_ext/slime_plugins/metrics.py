"""Kernel rollout metrics from Samples built by this package (their `metadata["kernel_rl"]`).

Counted per trajectory (the per_turn samples of one trajectory share `(group_index, index)` and
are counted once); aborted trajectories are only counted in `aborted_rate`:

- `compile_rate`, `correct_rate`, `fast_1_rate`: share of trajectories with at least one turn that
  compiled / was correct / was correct with speedup > 1 (KernelBench's fast_1; never on CPU, where
  there is no timing); the same per level (`level{L}/...`, level from the prompt record, `unknown`
  when not known) and per turn (`turn{t}/...`, among trajectories that reached turn t);
- `mean_turns`, `early_stop_rate`, `mean_return`: the mean reward of each trajectory's first
  sample (R under trajectory credit, G_0 under per_turn: both are sum_t gamma^t r_t);
- `eval_latency_s/{mean,p50,max}` over evaluated turns (the eval server's `elapsed_s`);
- `eval_phase_s/{phase}/mean`: the eval server's seconds in each phase of an evaluation
  (`compile`, `correctness`, `timing`, `gpu_wait`, ...), over the evaluated turns that ran it:
  where the evaluation time of the loop goes;
- `episode_s/mean`, `episode_generate_s/mean`, `episode_eval_s/mean`: where an episode's wall time
  went (generation vs evaluation; episodes run concurrently, so these do not add up to the step's
  rollout time), over trajectories whose writer recorded it;
- `speedup_correct/mean` over correct, timed turns; `own_share_correct/mean` over correct, profiled
  turns (GPU: the share of the forward's GPU time in the candidate's own kernels, which the
  recipe's `reward.profile_scale` / `reward.prs_min_share` read);
- per role (`role/{generator,fixer,optimizer}/...`: slime_ext/rollout/roles.py), over the turns
  played in that role: `n`, `correct_rate`, `fast_1_rate`, `speedup_correct_mean`;
- `status/{status}`: share of the evaluated turns that got each status (`ok`, `compile_error`,
  `incorrect`, `rejected`, ...), and `check/{id}`: share of the evaluated turns that a check ended
  (`static.forbidden_api`, `judge.output`, ...): why candidates fail, step by step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from krl_common.stats import percentile
from slime_ext.slime_plugins.samples import METADATA_KEY

__all__ = ["kernel_metrics"]


def _rate(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def _put_mean(out: dict[str, float], key: str, values: list[float]) -> None:
    """out[key] = the mean of values; no key when there are none (a run without them logs nothing)."""
    if values:
        out[key] = sum(values) / len(values)


def _fast1(turn: dict[str, Any]) -> bool:
    return bool(turn["correct"]) and turn["speedup"] is not None and turn["speedup"] > 1.0


def _outcomes(turns: list[dict[str, Any]]) -> dict[str, bool]:
    return {
        "compile_rate": any(t["compiled"] for t in turns),
        "correct_rate": any(t["correct"] for t in turns),
        "fast_1_rate": any(_fast1(t) for t in turns),
    }


def _trajectories(samples: Sequence[Any]) -> list[tuple[dict[str, Any], float]]:
    """(kernel_rl metadata, reward of the first sample) per trajectory, in first-seen order."""
    seen: dict[tuple[Any, Any], tuple[dict[str, Any], float]] = {}
    for s in samples:
        meta = (s.metadata or {}).get(METADATA_KEY)
        if meta is None:
            continue
        key = (s.group_index, s.index)
        turn = meta.get("turn")
        if key not in seen or turn == 0:
            seen[key] = (meta, float(s.reward) if isinstance(s.reward, (int, float)) else 0.0)
    return list(seen.values())


def kernel_metrics(samples: Sequence[Any], prefix: str = "rollout/kernel/") -> dict[str, float]:
    """The metrics in the module doc, keys prefixed with `prefix`."""
    trajectories = _trajectories(samples)
    if not trajectories:
        return {}
    live = [(m, r) for m, r in trajectories if m.get("status") != "aborted"]
    out: dict[str, float] = {
        "trajectories": float(len(trajectories)),
        "aborted_rate": 1.0 - len(live) / len(trajectories),
    }
    if live:
        outcomes = [_outcomes(m["turns"]) for m, _ in live]
        for name in ("compile_rate", "correct_rate", "fast_1_rate"):
            out[name] = _rate([o[name] for o in outcomes])
        out["mean_turns"] = sum(len(m["turns"]) for m, _ in live) / len(live)
        out["early_stop_rate"] = _rate([bool(m.get("early_stopped")) for m, _ in live])
        out["mean_return"] = sum(r for _, r in live) / len(live)
        by_level: dict[str, list[dict[str, bool]]] = {}
        for (m, _), o in zip(live, outcomes, strict=True):
            by_level.setdefault(str(m.get("level") or "unknown"), []).append(o)
        for level, items in sorted(by_level.items()):
            out[f"level{level}/n"] = float(len(items))
            for name in ("compile_rate", "correct_rate", "fast_1_rate"):
                out[f"level{level}/{name}"] = _rate([o[name] for o in items])
        max_turns = max(len(m["turns"]) for m, _ in live)
        for t in range(max_turns):
            turns = [m["turns"][t] for m, _ in live if len(m["turns"]) > t]
            out[f"turn{t}/n"] = float(len(turns))
            out[f"turn{t}/compile_rate"] = _rate([x["compiled"] for x in turns])
            out[f"turn{t}/correct_rate"] = _rate([x["correct"] for x in turns])
            out[f"turn{t}/fast_1_rate"] = _rate([_fast1(x) for x in turns])
            out[f"turn{t}/mean_reward"] = sum(x["reward"] for x in turns) / len(turns)
        by_role: dict[str, list[dict[str, Any]]] = {}
        for m, _ in live:
            for x in m["turns"]:
                if x.get("role"):
                    by_role.setdefault(x["role"], []).append(x)
        for role, turns in sorted(by_role.items()):
            out[f"role/{role}/n"] = float(len(turns))
            out[f"role/{role}/correct_rate"] = _rate([x["correct"] for x in turns])
            out[f"role/{role}/fast_1_rate"] = _rate([_fast1(x) for x in turns])
            timed = [x["speedup"] for x in turns if x["correct"] and x["speedup"] is not None]
            _put_mean(out, f"role/{role}/speedup_correct_mean", timed)
    all_turns = [t for m, _ in trajectories for t in m["turns"]]
    evaluated = [t for t in all_turns if t.get("evaluated") and t.get("status")]
    for status in sorted({str(t["status"]) for t in evaluated}):
        out[f"status/{status}"] = _rate([t["status"] == status for t in evaluated])
    for check in sorted({c for t in evaluated for c in t.get("checks") or ()}):
        out[f"check/{check}"] = _rate([check in (t.get("checks") or ()) for t in evaluated])
    latencies = [float(t["eval_s"]) for t in all_turns if t.get("eval_s") is not None]
    if latencies:
        out["eval_latency_s/mean"] = sum(latencies) / len(latencies)
        out["eval_latency_s/p50"] = float(percentile(latencies, 0.5))
        out["eval_latency_s/max"] = max(latencies)
    phase_values: dict[str, list[float]] = {}
    for t in all_turns:
        for phase, seconds in (t.get("phases") or {}).items():
            phase_values.setdefault(phase, []).append(float(seconds))
    for phase, values in sorted(phase_values.items()):
        _put_mean(out, f"eval_phase_s/{phase}/mean", values)
    timings = [m["timing"] for m, _ in trajectories if m.get("timing")]
    for key, name in (
        ("total_s", "episode_s"),
        ("generate_s", "episode_generate_s"),
        ("eval_s", "episode_eval_s"),
    ):
        _put_mean(out, f"{name}/mean", [t[key] for t in timings if key in t])
    speedups = [t["speedup"] for t in all_turns if t["correct"] and t["speedup"] is not None]
    _put_mean(out, "speedup_correct/mean", speedups)
    shares = [t["own_share"] for t in all_turns if t["correct"] and t.get("own_share") is not None]
    _put_mean(out, "own_share_correct/mean", shares)
    return {prefix + k: v for k, v in out.items()}
