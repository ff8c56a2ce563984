"""SCRIPTED answers for the embedded `/generate` engine (labelled; not a model's answers).

The CPU dry run and GPU plumbing runs serve a tiny random model, which writes no code. Scripted
mode replaces its answer, for a prompt that holds a known problem, with a known text (token ids and
log-probs still come from the model, teacher-forced: `slime_ext/dev_engine/engine.py`). This module holds
what is answered and how one answer is chosen, so the engine and the tools share one definition.

Answers file (jsonl, one answer per line): `{"match": str, "text": str, "correct": bool,
"label": str}`. `match` is a substring of the decoded request context (the dry run uses the problem
source), `text` the answer; `correct` (default true) says whether `text` is a right answer, and
`label` (default "") names it in logs and in each response's `meta_info.scripted`. Answers with the
same `match` form that prompt's pool; the first `match` (in file order) found in the context wins.

- Plain scripted mode serves the first correct answer of the pool, always (wrong ones are ignored).
- Mixed mode (`--scripted-mix P`) draws per request: correct with probability P, else wrong (see
  `choose_answer`). The draw depends only on the engine seed, the request's input ids and how many
  requests with the same ids came before, so a run is reproducible, the n samples of one GRPO group
  (same ids) get different draws, and each later turn (whose context holds the earlier answers and
  their feedback) draws again, independently of the turn before.

`sample_prompt_records` gives the prompt records of the bundled sample problems (what the dry
run and the single-GPU preset train on), `sample_answers` the answers for them: each problem's correct
candidate; for the mix also its bundled candidates that compile but are incorrect or fail to
compile, and an answer without code (`NO_CODE_TEXT`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slime_ext.rollout.problems import PromptRecord

__all__ = [
    "NO_CODE_TEXT",
    "ScriptedAnswer",
    "choose_answer",
    "context_key",
    "load_scripted_rules",
    "mix_draw",
    "read_answers",
    "sample_answers",
    "sample_names",
    "sample_prompt_records",
    "write_answers",
]

NO_CODE_TEXT = "I am not able to write this kernel."
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


@dataclass(frozen=True)
class ScriptedAnswer:
    """One scripted answer: served for a request whose decoded context contains `match`."""

    match: str
    text: str
    correct: bool = True
    label: str = ""


def read_answers(path: str | os.PathLike[str]) -> list[ScriptedAnswer]:
    """The answers of a jsonl file; ValueError naming the line of a bad one."""
    answers = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                match, text = row["match"], row["text"]
                correct, label = row.get("correct", True), row.get("label", "")
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: expected {{'match': str, 'text': str}} ({exc})") from None
            if not (isinstance(match, str) and match and isinstance(text, str)):
                raise ValueError(f"{path}:{lineno}: match must be a non-empty string and text a string")
            if not isinstance(correct, bool) or not isinstance(label, str):
                raise ValueError(f"{path}:{lineno}: correct must be a boolean and label a string")
            answers.append(ScriptedAnswer(match, text, correct, label))
    return answers


def load_scripted_rules(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The correct answers of a file as `(match, text)` pairs: what plain scripted mode serves."""
    return [(a.match, a.text) for a in read_answers(path) if a.correct]


def write_answers(path: str | os.PathLike[str], answers: Iterable[ScriptedAnswer]) -> int:
    """Write an answers file atomically; returns the number of answers."""
    from krl_common.fileio import atomic_write

    rows = [json.dumps(asdict(a)) + "\n" for a in answers]
    atomic_write(path, "".join(rows))
    return len(rows)


def _fenced(source: str) -> str:
    return f"```python\n{source.strip()}\n```"


def sample_names(names: Sequence[str] | None = None) -> list[str]:
    """The bundled sample problems named (all of them when `names` is empty); ValueError naming
    the unknown ones and what is bundled."""
    from eval_server import samples

    bundled = list(samples.problem_names())
    unknown = sorted(set(names or ()) - set(bundled))
    if unknown:
        raise ValueError(f"unknown sample problem(s) {', '.join(unknown)}; bundled: {', '.join(bundled)}")
    return list(names) if names else bundled


def sample_prompt_records(names: Sequence[str] | None = None) -> list[PromptRecord]:
    """Prompt records (slime_ext/rollout/problems.py, split `train`) of the bundled sample problems (all,
    or `names`); ValueError for an unknown name."""
    from eval_server import samples
    from slime_ext.rollout.problems import PromptRecord

    return [
        PromptRecord(
            instance_id=f"sample_{name}",
            level=1,
            problem_id=name,
            name=name,
            reference=samples.load_problem(name),
            split="train",
            metadata={"source": "eval_server/samples/problems"},
        )
        for name in sample_names(names)
    ]


def sample_answers(names: Sequence[str] | None = None, *, wrong: bool = False) -> list[ScriptedAnswer]:
    """Answers for the bundled sample problems (all, or `names`), matched by the problem source:
    the correct candidate in a python fence; with `wrong`, also each bundled candidate of that
    problem whose expected status is in `samples.WRONG_STATUSES`, and `NO_CODE_TEXT`."""
    from eval_server import samples

    answers = []
    for name in names or samples.problem_names():
        match = samples.load_problem(name).strip("\n")
        correct = f"{name}__correct"
        answers.append(ScriptedAnswer(match, _fenced(samples.load_candidate(correct)), True, correct))
        if not wrong:
            continue
        for candidate in samples.candidates_of(name, samples.WRONG_STATUSES):
            answers.append(
                ScriptedAnswer(match, _fenced(samples.load_candidate(candidate)), False, candidate)
            )
        answers.append(ScriptedAnswer(match, NO_CODE_TEXT, False, "no_code"))
    return answers


def context_key(seed: int, input_ids: Sequence[int]) -> bytes:
    """The hash of (seed, input ids) that a mixed-mode draw starts from."""
    return hashlib.sha256(f"{seed}:{','.join(map(str, input_ids))}".encode()).digest()


def mix_draw(key: bytes, occurrence: int) -> tuple[float, int]:
    """The draw of the `occurrence`-th request (0-based) of a context (`context_key`): `u` in
    [0, 1) and an integer to pick within a pool.

    `u = frac(h + occurrence * 0.618...)` with `h` the key read as a number in [0, 1): each `u` is
    uniform over seeds and contexts, and the `u` of repeated requests (a GRPO group's samples) are
    spread evenly (golden-ratio sequence): for P = 0.5 any 3 consecutive ones hold both kinds of
    answer (the largest gap between 3 such points is 0.382 < 0.5).
    """
    u = (int.from_bytes(key[:8], "big") / 2**64 + occurrence * _GOLDEN) % 1.0
    pick = hashlib.sha256(key + occurrence.to_bytes(8, "big")).digest()
    return u, int.from_bytes(pick[:8], "big")


def choose_answer(pool: Sequence[ScriptedAnswer], p: float, u: float, pick: int) -> ScriptedAnswer:
    """A correct answer of `pool` if `u < p`, else a wrong one; `pick` chooses among them.
    ValueError if the pool has no answer of the kind drawn."""
    want = u < p
    kind = [a for a in pool if a.correct == want]
    if not kind:
        raise ValueError(f"no {'correct' if want else 'wrong'} scripted answer for this prompt")
    return kind[pick % len(kind)]
