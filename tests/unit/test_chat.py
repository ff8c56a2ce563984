"""slime_ext.rollout.chat: prompt rendering and the turn-delta rule, against a full re-render.

Uses the tiny locally trained tokenizer with a Qwen3-style ChatML template (tests/tiny_qwen3.py).
Where the two intentionally differ (reasoning of earlier turns, the empty think block of
enable_thinking=False), the test pins the difference down.
"""

from __future__ import annotations

import pytest

from slime_ext.rollout.chat import ChatRenderer
from tests.tiny_qwen3 import tiny_tokenizer

pytestmark = pytest.mark.unit

MESSAGES = [
    {"role": "system", "content": "You write Triton kernels."},
    {"role": "user", "content": "Write ModelNew for:\n```python\nclass Model: pass\n```"},
]
ANSWERS = [
    "Here is my kernel:\n```python\nimport triton\nx = 1\n```",
    "Fixed:\n```python\nimport triton\nx = 2\n```",
]
FEEDBACK = [
    {"role": "user", "content": "Status: incorrect. max_abs_diff 0.5\n\nFix the problem."},
    {"role": "user", "content": "Status: ok. speedup 1.2x\n\nMake it faster."},
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def incremental(renderer: ChatRenderer, answers: list[str], feedback: list[dict[str, str]]) -> list[int]:
    """What an episode builds: prompt ids, then per turn sampled ids (+ close) and the delta."""
    ids = renderer.prompt_ids(MESSAGES)
    for i, answer in enumerate(answers):
        sampled = renderer.encode(answer) + [renderer.end_of_turn_id]
        ids += sampled + renderer.closing_ids(sampled)
        if i < len(feedback):
            ids += renderer.delta_ids([feedback[i]])
    return ids


def full_render(renderer: ChatRenderer, answers: list[str], feedback: list[dict[str, str]]) -> list[int]:
    msgs = list(MESSAGES)
    for i, answer in enumerate(answers):
        msgs.append({"role": "assistant", "content": answer})
        if i < len(feedback):
            msgs.append(feedback[i])
    return renderer.encode(renderer.render(msgs, add_generation_prompt=True))


def test_prompt_ids_are_the_rendered_template(tok) -> None:
    r = ChatRenderer(tok)
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert r.prompt_ids(MESSAGES) == tok.encode(text, add_special_tokens=False)
    assert r.decode(r.prompt_ids(MESSAGES)) == text


def test_delta_text_for_chatml(tok) -> None:
    r = ChatRenderer(tok)
    assert r.delta_text([FEEDBACK[0]]) == (
        "\n<|im_start|>user\n" + FEEDBACK[0]["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    )
    r_off = ChatRenderer(tok, enable_thinking=False)
    assert r_off.delta_text([FEEDBACK[0]]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("turns", [0, 1, 2])
def test_delta_equals_full_rerender_without_reasoning(tok, turns: int) -> None:
    """After `turns` answered-and-fed-back turns, the carried ids equal the re-rendered chat."""
    r = ChatRenderer(tok)
    assert incremental(r, ANSWERS[:turns], FEEDBACK[:turns]) == full_render(
        r, ANSWERS[:turns], FEEDBACK[:turns]
    )


def test_closing_ids(tok) -> None:
    r = ChatRenderer(tok)
    end = r.end_of_turn_id
    assert r.closing_ids([5, 6, end]) == []
    assert r.closing_ids([5, 6]) == [end]
    assert r.closing_ids([]) == [end]
    # A turn cut by length, closed by the non-trained <|im_end|>, still matches the re-render.
    answer = "partial answer cut"
    ids = r.prompt_ids(MESSAGES) + r.encode(answer)
    ids += r.closing_ids(r.encode(answer)) + r.delta_ids([FEEDBACK[0]])
    assert ids == full_render(r, [answer], [FEEDBACK[0]])


def test_intentional_difference_reasoning_kept(tok) -> None:
    """The template strips reasoning from earlier assistant turns; the episode keeps the tokens
    the model sampled, so the model's context and the trained tokens are what it produced."""
    r = ChatRenderer(tok)
    answer = "<think>\nlet me think\n</think>\n\n" + ANSWERS[0]
    inc = incremental(r, [answer], [FEEDBACK[0]])
    full = full_render(r, [answer], [FEEDBACK[0]])
    assert inc != full
    assert "let me think" in r.decode(inc) and "let me think" not in r.decode(full)
    assert r.decode(inc).replace("<think>\nlet me think\n</think>\n\n", "") == r.decode(full)


def test_intentional_difference_empty_think_with_thinking_off(tok) -> None:
    """With enable_thinking=False the generation prompt holds an empty think block; it stays in
    the history here (the model saw it), while a re-render of history omits it."""
    r = ChatRenderer(tok, enable_thinking=False)
    inc = r.decode(incremental(r, [ANSWERS[0]], [FEEDBACK[0]]))
    full = r.decode(full_render(r, [ANSWERS[0]], [FEEDBACK[0]]))
    assert inc.count("<think>") == 2 and full.count("<think>") == 1
    assert inc.replace("<think>\n\n</think>\n\n", "", 1) == full


def test_end_of_turn_must_be_one_token(tok) -> None:
    with pytest.raises(ValueError):
        ChatRenderer(tok, end_of_turn="not a single token here")


def test_delta_works_with_prefix_unstable_template(tok) -> None:
    """Like Qwen3's, the test template renders the last assistant turn with an empty think block,
    so [user, assistant] is not a prefix of [user, assistant, user]; the delta must not rely on it."""
    r = ChatRenderer(tok)
    short = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    prev = r.render(short, add_generation_prompt=False)
    full = r.render([*short, FEEDBACK[0]], add_generation_prompt=True)
    assert not full.startswith(prev)
    assert r.delta_text([FEEDBACK[0]]) == full[full.index("a<|im_end|>") + len("a<|im_end|>") :]


def test_delta_of_several_messages(tok) -> None:
    r = ChatRenderer(tok)
    msgs = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    assert r.delta_text(msgs) == (
        "\n<|im_start|>user\none<|im_end|>\n<|im_start|>user\ntwo<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError):
        r.delta_text([])
