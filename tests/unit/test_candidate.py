"""slime_ext.rollout.candidate: think stripping and last-python-block extraction."""

from __future__ import annotations

import pytest

from slime_ext.rollout.candidate import extract_candidate, strip_think

pytestmark = pytest.mark.unit

F = "```"


def test_last_python_block_wins() -> None:
    text = f"first\n{F}python\na = 1\n{F}\nthen\n{F}python\nb = 2\n{F}\n"
    assert extract_candidate(text) == "b = 2"


@pytest.mark.parametrize("tag", ["python", "py", "", "Python", "python3"])
def test_accepted_tags(tag: str) -> None:
    assert extract_candidate(f"{F}{tag}\nx = 1\n{F}") == "x = 1"


def test_other_languages_ignored() -> None:
    text = f"{F}python\nkeep = 1\n{F}\n{F}bash\nls -la\n{F}\n"
    assert extract_candidate(text) == "keep = 1"
    assert extract_candidate(f"{F}bash\nls\n{F}") is None


def test_no_block_and_empty_block() -> None:
    assert extract_candidate("no code here") is None
    assert extract_candidate("") is None
    assert extract_candidate(f"{F}python\n\n{F}") is None


def test_closed_think_block_removed() -> None:
    text = f"<think>\n{F}python\nthought = 1\n{F}\n</think>\nanswer\n{F}python\nreal = 1\n{F}"
    assert extract_candidate(text) == "real = 1"
    only_in_think = f"<think>\n{F}python\nthought = 1\n{F}\n</think>\nno code"
    assert extract_candidate(only_in_think) is None


def test_unterminated_think_swallows_rest() -> None:
    text = f"{F}python\nbefore = 1\n{F}\n<think>\n{F}python\nafter = 1\n{F}\nstill thinking"
    assert extract_candidate(text) == "before = 1"
    assert extract_candidate(f"<think>\n{F}python\nx = 1\n{F}") is None


def test_response_starting_inside_think() -> None:
    # Templates that open <think> in the prompt: the response starts inside the block.
    text = f"reasoning {F}python\nno = 1\n{F}\n</think>\n{F}python\nyes = 1\n{F}"
    assert extract_candidate(text) == "yes = 1"
    assert strip_think("a</think>b") == "b"


def test_unterminated_fence_is_not_a_block() -> None:
    text = f"{F}python\ndone = 1\n{F}\n{F}python\ncut off mid"
    assert extract_candidate(text) == "done = 1"


def test_multiline_source_kept_verbatim() -> None:
    src = "import torch\n\n\nclass ModelNew:\n    def f(self):\n        return 1"
    assert extract_candidate(f"Here:\n{F}python\n{src}\n{F}\nDone.") == src
