"""Chat rendering through the model's own chat template, with token ids computed once.

Training must score exactly the tokens the model sampled, so an episode never re-tokenizes text it
already holds. The token sequence of an episode is built by appending:

    prompt_ids                = tokenize(render(system + user_1, add_generation_prompt=True))
    + sampled ids of turn 1     (verbatim from the engine; mask 1)
    + closing ids               (only if turn 1 did not end with the end-of-turn token; mask 0)
    + delta ids of user_2       (template text between the end-of-turn token and the next
                                 assistant's first sampled token; mask 0)
    + sampled ids of turn 2 ...

The delta rule. The delta of a new user message is found by rendering a fixed conversation with
the model's template: `[user U, assistant A, <new messages>]` with the generation prompt, where U and
A are unique placeholder strings. The delta text is everything after the first end-of-turn marker
that follows A. Only that text is tokenized (without special tokens added), and it is appended
after the stored tokens. Earlier text is never tokenized again. (Comparing the renders of
`[U, A]` and `[U, A, new]` would not work for Qwen3: its template renders the LAST assistant
message with an empty `<think>\n\n</think>\n\n` block, and earlier ones without, so the shorter
render is not a prefix of the longer one.)

For Qwen3's template (ChatML), with end-of-turn marker `<|im_end|>`:
- the render is `...A<|im_end|>\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n`,
  plus `<think>\n\n</think>\n\n` when rendering with `enable_thinking=False`;
- the leading `\n` is the template's newline after every turn, which the model never samples (it
  stops on `<|im_end|>`);
- so the delta is `\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n[...]`.
- The model's sampled tokens include `<|im_end|>` when it stopped on it (SGLang with
  `no_stop_trim`). When it stopped for another reason (length, or another stop token such as
  `<|endoftext|>`), `closing_ids()` returns `[<|im_end|>]`, appended as a non-trained token so the
  history is a well-formed turn.

Where the result intentionally differs from re-rendering the whole conversation with the template:
Qwen3's template removes `<think>...</think>` reasoning from assistant turns that precede the last
user message; with `enable_thinking=False` the empty think block of the generation prompt is part
of the carried history but not of a re-render; and re-tokenizing decoded text may choose different
token boundaries than the model sampled. Here the model's earlier turns stay exactly as sampled, reasoning included: the model
sees at turn t+1 what it produced at turn t, and training scores those same tokens. Without
reasoning and with canonical tokenization the two agree token for token (tested).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ChatRenderer"]

# Placeholder contents for the delta render; unlikely to occur in any template or message.
_PLACEHOLDER_USER = "\u2063placeholder-user-7d1f\u2063"
_PLACEHOLDER_ASSISTANT = "\u2063placeholder-assistant-3b9e\u2063"


class ChatRenderer:
    """Renders prompts and per-turn deltas for one tokenizer (a transformers tokenizer)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        enable_thinking: bool | None = None,
        end_of_turn: str = "<|im_end|>",
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        """Args:
        tokenizer: a transformers tokenizer with a chat template.
        enable_thinking: passed to the template as `enable_thinking` (None: not passed).
        end_of_turn: the token that ends an assistant turn (Qwen3: `<|im_end|>`); must be one token.
        chat_template_kwargs: extra variables for the template.
        """
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.end_of_turn = end_of_turn
        self.template_kwargs = dict(chat_template_kwargs or {})
        if enable_thinking is not None:
            self.template_kwargs["enable_thinking"] = enable_thinking
        ids = self.encode(end_of_turn)
        if len(ids) != 1:
            raise ValueError(f"end_of_turn {end_of_turn!r} is not a single token for this tokenizer: {ids}")
        self.end_of_turn_id: int = ids[0]

    # ------------------------------------------------------------------ primitives

    def render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool) -> str:
        """The template's text for a conversation (no tokenization)."""
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of text, without BOS/EOS or any other added special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids, special tokens kept (`<think>`, `<|im_end|>` stay visible)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # ------------------------------------------------------------------ episode API

    def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of the opening messages plus the generation prompt (computed once per episode)."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def delta_text(self, new_messages: Sequence[Mapping[str, str]]) -> str:
        """Template text that follows an assistant's end-of-turn token and introduces
        `new_messages` and the next assistant turn (see the module docstring)."""
        if not new_messages:
            raise ValueError("delta_text needs at least one new message")
        base = [
            {"role": "user", "content": _PLACEHOLDER_USER},
            {"role": "assistant", "content": _PLACEHOLDER_ASSISTANT},
        ]
        full = self.render(base + [dict(m) for m in new_messages], add_generation_prompt=True)
        at = full.find(_PLACEHOLDER_ASSISTANT)
        if at == -1 or full.find(_PLACEHOLDER_ASSISTANT, at + 1) != -1:
            raise ValueError("chat template did not render the assistant placeholder exactly once")
        marker = full.find(self.end_of_turn, at + len(_PLACEHOLDER_ASSISTANT))
        if marker == -1:
            raise ValueError(f"chat template does not end assistant turns with {self.end_of_turn!r}")
        delta = full[marker + len(self.end_of_turn) :]
        for m in new_messages:
            if m.get("content") and m["content"].strip() not in delta:
                raise ValueError("a new message's content is not in the rendered delta")
        return delta

    def delta_ids(self, new_messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids to append (mask 0) after the previous turn's (closed) sampled tokens."""
        return self.encode(self.delta_text(new_messages))

    def closing_ids(self, sampled_ids: Sequence[int]) -> list[int]:
        """[end_of_turn_id] if the sampled turn does not already end with it, else []."""
        if sampled_ids and sampled_ids[-1] == self.end_of_turn_id:
            return []
        return [self.end_of_turn_id]
