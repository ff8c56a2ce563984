"""A tiny Qwen3-architecture model and a locally trained tokenizer, for tests (no downloads).

- Tokenizer: byte-level BPE trained with `tokenizers` on the bundled sample problems and
  candidates plus the prompt templates, wrapped as a `PreTrainedTokenizerFast`, with the special
  tokens of Qwen3 (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`) and a
  ChatML chat template written here in the style of Qwen3's: `<|im_start|>role\\n...<|im_end|>\\n`
  per message, `<|im_start|>assistant\\n` as generation prompt, an empty think block in the
  generation prompt when `enable_thinking=False`, the reasoning of assistant turns that precede
  the last user message removed, and assistant turns after it rendered with their think block
  (an empty one for the final turn), as Qwen3's template does; so, as with Qwen3, rendering
  `[user, assistant]` is not a prefix of rendering `[user, assistant, user]`.
- Model: `Qwen3ForCausalLM` with 2 layers, hidden 64, 4 heads, 2 kv heads, random weights (seeded).

Both are built once per process (`tiny_tokenizer()`, `tiny_model()`) and take about a second.
"""

from __future__ import annotations

import functools
from importlib import resources

TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set content = m['content'] -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_user and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def _corpus() -> list[str]:
    from slime_ext import prompts

    texts = []
    for folder in ("problems", "candidates"):
        root = resources.files("eval_server.samples").joinpath(folder)
        for entry in sorted(root.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".py"):
                texts.append(entry.read_text(encoding="utf-8"))
    texts += [prompts.DEFAULT_SYSTEM, prompts.DEFAULT_INSTRUCTIONS, prompts.DEFAULT_EXAMPLE]
    texts += [
        prompts.DEFAULT_FIX_INSTRUCTION,
        prompts.DEFAULT_FASTER_INSTRUCTION,
        prompts.DEFAULT_NO_CODE_FEEDBACK,
    ]
    return texts


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
    )
    fast.chat_template = TEMPLATE
    return fast


@functools.lru_cache(maxsize=1)
def tiny_model():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = tiny_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(1234)
    model = Qwen3ForCausalLM(config).float().eval()
    return model
