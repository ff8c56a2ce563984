"""slime_ext/dev_engine/scripted.py: the SCRIPTED answers file, the bundled sample answers and the mixed-mode
draw (reproducible, P-frequent, spread over the samples of one group)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from eval_server import samples
from slime_ext.dev_engine.scripted import (
    NO_CODE_TEXT,
    ScriptedAnswer,
    choose_answer,
    context_key,
    load_scripted_rules,
    mix_draw,
    read_answers,
    sample_answers,
    write_answers,
)

pytestmark = pytest.mark.unit

POOL = [
    ScriptedAnswer("m", "right", True, "c"),
    ScriptedAnswer("m", "wrong a", False, "a"),
    ScriptedAnswer("m", "wrong b", False, "b"),
]


def test_answers_file_round_trip_defaults_and_plain_rules(tmp_path: Path) -> None:
    path = tmp_path / "answers.jsonl"
    assert write_answers(path, POOL) == 3
    assert read_answers(path) == POOL
    path.write_text(
        '{"match": "relu", "text": "x = 1"}\n\n{"match": "relu", "text": "y", "correct": false}\n'
    )
    assert read_answers(path) == [ScriptedAnswer("relu", "x = 1"), ScriptedAnswer("relu", "y", False)]
    assert load_scripted_rules(path) == [("relu", "x = 1")]  # plain mode: the correct ones


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"match": "", "text": "x"}', "non-empty"),
        ('{"match": "m"}', "expected"),
        ('{"match": "m", "text": "x", "correct": "yes"}', "boolean"),
        ('{"match": "m", "text": "x", "label": 3}', "label"),
        ("[1, 2]", "expected"),
    ],
)
def test_bad_answer_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"match": "m", "text": "x"}\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl:2: .*{message}"):
        read_answers(path)


def test_sample_answers_correct_only_and_with_wrong_ones() -> None:
    relu = samples.load_problem("relu").strip("\n")
    plain = sample_answers(["relu"])
    assert plain == [
        ScriptedAnswer(
            relu, f"```python\n{samples.load_candidate('relu__correct').strip()}\n```", True, "relu__correct"
        )
    ]
    mixed = sample_answers(["relu", "sum_dim"], wrong=True)
    labels = {a.match[:20]: [] for a in mixed}
    for a in mixed:
        labels[a.match[:20]].append((a.label, a.correct))
    assert labels[relu[:20]] == [
        ("relu__correct", True),
        ("relu__wrong_math", False),  # compiles, incorrect
        ("relu__syntax_error", False),  # does not compile
        ("relu__no_modelnew", False),  # does not compile
        ("no_code", False),
    ]
    assert labels[samples.load_problem("sum_dim").strip("\n")[:20]] == [
        ("sum_dim__correct", True),
        ("no_code", False),  # no bundled wrong candidate for sum_dim
    ]
    no_code = [a for a in mixed if a.label == "no_code"]
    assert all(a.text == NO_CODE_TEXT and "```" not in a.text for a in no_code)
    assert len(sample_answers(wrong=True)) > len(sample_answers()) == len(samples.problem_names())


def test_draw_is_reproducible_and_depends_on_seed_ids_and_occurrence() -> None:
    key = context_key(0, [1, 2, 3])
    assert mix_draw(key, 0) == mix_draw(context_key(0, [1, 2, 3]), 0)
    draws = {mix_draw(key, k) for k in range(5)}
    draws |= {mix_draw(context_key(1, [1, 2, 3]), 0), mix_draw(context_key(0, [1, 2, 4]), 0)}
    assert len(draws) == 7
    assert all(0.0 <= u < 1.0 for u, _ in draws)


def test_choose_answer_kinds_and_pick() -> None:
    assert choose_answer(POOL, 0.5, 0.49, 7).label == "c"
    assert choose_answer(POOL, 0.5, 0.5, 0).label == "a"
    assert choose_answer(POOL, 0.5, 0.9, 1).label == "b"
    assert choose_answer(POOL, 1.0, 0.999, 5).correct
    assert not choose_answer(POOL, 0.0, 0.0, 5).correct
    with pytest.raises(ValueError, match="no wrong scripted answer"):
        choose_answer(POOL[:1], 0.5, 0.7, 0)
    with pytest.raises(ValueError, match="no correct scripted answer"):
        choose_answer(POOL[1:], 0.5, 0.1, 0)


def _group(seed: int, ids: list[int], n: int, p: float) -> list[ScriptedAnswer]:
    key = context_key(seed, ids)
    return [choose_answer(POOL, p, *mix_draw(key, k)) for k in range(n)]


def test_each_group_of_three_holds_both_kinds_and_frequency_is_p() -> None:
    rng = random.Random(7)
    contexts = [[rng.randrange(1000) for _ in range(rng.randrange(1, 30))] for _ in range(300)]
    for ids in contexts:
        assert {a.correct for a in _group(0, ids, 3, 0.5)} == {True, False}
    for p in (0.2, 0.7):
        firsts = [_group(3, ids, 1, p)[0].correct for ids in contexts]
        assert sum(firsts) / len(firsts) == pytest.approx(p, abs=0.07)
        group = _group(3, contexts[0], 200, p)  # the samples of one context too
        assert sum(a.correct for a in group) / 200 == pytest.approx(p, abs=0.02)
    wrong_labels = {a.label for a in _group(0, contexts[1], 40, 0.5) if not a.correct}
    assert wrong_labels == {"a", "b"}
