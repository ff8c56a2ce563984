"""TEST DOUBLE of slime/utils/types.py `Sample` (THUDM/slime @ 624b824a). Not slime.

Same fields, defaults and order as the real dataclass; `Status` with the real values; the helpers
the plug-ins and slime's conversion rely on:
- `get_reward_value(args)`: `reward[args.reward_key]` when a reward key is set, else `reward`;
- `effective_response_length`: `sum(loss_mask)` (or `response_length` without a mask);
- `to_dict` / `from_dict` (status as its string value, nested infos as dicts);
- `append_response_tokens(...)`: extends tokens / response_length / loss_mask / rollout_log_probs;
  trainable tokens need log-probs, non-trainable ones must not pass any (they get 0.0, mask 0);
  `meta_info["finish_reason"]["type"]` maps stop/length/abort to COMPLETED/TRUNCATED/ABORTED;
  lengths are validated after every call. Top-p replay and routed-expert metadata are not
  modelled: passing them fails an assertion, so a test can never pass by ignoring them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

_UNMODELLED_META_KEYS = (
    "top_p_token_ids",
    "top_p_kept_token_ids",
    "top_p_token_offsets",
    "top_p_kept_token_offsets",
    "routed_experts",
)


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        def to_dict(self) -> dict[str, int]:
            return dict(vars(self))

        @staticmethod
        def from_dict(data: dict) -> Sample.SpecInfo:
            return Sample.SpecInfo(**{k: data.get(k, 0) for k in vars(Sample.SpecInfo())})

    spec_info: SpecInfo = field(default_factory=SpecInfo)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return dict(vars(self))

        @staticmethod
        def from_dict(data: dict) -> Sample.PrefixCacheInfo:
            return Sample.PrefixCacheInfo(**{k: data.get(k, 0) for k in vars(Sample.PrefixCacheInfo())})

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["status"] = self.status.value
        out["spec_info"] = self.spec_info.to_dict()
        out["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return out

    @staticmethod
    def from_dict(data: dict) -> Sample:
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        data["spec_info"] = Sample.SpecInfo.from_dict(data.get("spec_info", {}))
        data["prefix_cache_info"] = Sample.PrefixCacheInfo.from_dict(data.get("prefix_cache_info", {}))
        names = set(Sample.__dataclass_fields__)
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    def get_reward_value(self, args) -> float:
        key = getattr(args, "reward_key", None)
        return self.reward[key] if key else self.reward

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def append_response_tokens(
        self,
        args=None,
        *,
        tokens=None,
        log_probs=None,
        trainable: bool = True,
        meta_info: dict | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        tokens = [int(t) for t in (tokens or [])]
        log_probs = None if log_probs is None else [float(x) for x in log_probs]
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("non-trainable response tokens should not pass rollout log probabilities.")
            log_probs = [0.0] * len(tokens)
        if meta_info and any(k in meta_info for k in _UNMODELLED_META_KEYS):
            raise AssertionError("the slime test double does not model top-p replay / routed experts")
        if text is not None:
            self.response += text
        before = self.response_length
        if tokens:
            self.tokens += tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:
                self.loss_mask = [1] * before
            self.loss_mask += [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and before:
                    raise ValueError("existing response tokens have no rollout_log_probs")
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs += log_probs
        if meta_info is not None and update_terminal_info and "finish_reason" in meta_info:
            self.prefix_cache_info.add(meta_info)
            if "weight_version" in meta_info:
                self.weight_versions.append(meta_info["weight_version"])
            kind = meta_info["finish_reason"]["type"]
            if kind == "length":
                self.status = Sample.Status.TRUNCATED
            elif kind == "abort":
                self.status = Sample.Status.ABORTED
            elif kind == "stop":
                self.status = Sample.Status.COMPLETED
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(
                f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}"
            )
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"rollout_log_probs length {len(self.rollout_log_probs)} != response_length {self.response_length}"
            )
