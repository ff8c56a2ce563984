"""TEST DOUBLE of SGLang's native `/generate` endpoint (not SGLang; for tests only).

The protocol, sampling and log-prob rules are those of the product engine
`slime_ext/dev_engine/engine.py` (`GenerateEngine`, which follows `/work/shared/slime_interfaces.md`
section 3); this double adds test controls on top:

SCRIPTED MODE (labelled as such): texts queued in `double.scripted` are answered in order instead
of sampling: the text is tokenized, `<|im_end|>` appended, cut to `max_new_tokens`, and each
token's log-prob is the model's teacher-forced log-prob under the same temperature, so scripted
turns obey the same log-prob contract. `double.abort_next = True` makes the next request finish
with `abort`. Every request body is kept in `double.requests`, every answer's ids in `double.outputs`.
"""

from __future__ import annotations

import collections
from typing import Any

from slime_ext.dev_engine.engine import GenerateEngine, Produced

__all__ = ["SGLangDouble"]


class SGLangDouble(GenerateEngine):
    def __init__(self, model: Any, tokenizer: Any, *, seed: int = 0) -> None:
        super().__init__(model, tokenizer, seed=seed, model_path="test-double")
        self.im_end = self.end_of_turn
        self.scripted: collections.deque[str] = collections.deque()
        self.abort_next = False
        self.requests: list[dict[str, Any]] = []
        self.outputs: list[list[int]] = []  # token ids answered, per request

    def reset(self) -> None:
        """Forget scripted answers, a pending abort and the request log (between tests)."""
        self.scripted.clear()
        self.abort_next = False
        self.requests.clear()
        self.outputs.clear()

    def produce(
        self, input_ids: list[int], *, temperature: float, max_new: int, body: dict[str, Any], **sampling: Any
    ) -> Produced:
        self.requests.append(body)
        if self.abort_next:
            self.abort_next = False
            ids, logprobs, finish = [], [], {"type": "abort", "message": "aborted by test"}
        elif self.scripted:
            ids, logprobs, finish = self.teacher_forced(
                input_ids, self.scripted.popleft(), temperature, max_new
            )
        else:
            ids, logprobs, finish = super().produce(
                input_ids, temperature=temperature, max_new=max_new, body=body, **sampling
            )
        self.outputs.append(list(ids))
        return ids, logprobs, finish
