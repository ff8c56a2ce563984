"""TEST DOUBLE of the few slime modules the plug-ins import (not slime; for tests only).

slime (THUDM/slime, Megatron + SGLang + Ray) cannot be installed on the development machines, so
the tests put this directory on `sys.path` (`install()`), which makes `import slime...` resolve to
the double. It mirrors the interfaces of THUDM/slime @ 624b824a (see
/work/shared/slime_interfaces.md), written from reading that code, not copied:

- `slime.utils.types.Sample`: the real fields and defaults, `Sample.Status`, `to_dict`/`from_dict`,
  `get_reward_value`, `effective_response_length`, `append_response_tokens` (without the top-p
  replay and routed-expert metadata, which the plug-ins never pass; the double raises if asked);
- `slime.rollout.base_types`: `RolloutFnTrainOutput`, `RolloutFnEvalOutput`, `call_rollout_fn`;
- `slime.observability.rollout_data_utils.validate_rollout_id_annotated` (the fan-out check
  `RolloutManager._get_rollout_data` runs on a rollout function's output);
- `slime.observability.logging_utils.log` (records the calls in `LOGGED` instead of W&B) and
  `slime.observability.metric_utils.compute_rollout_step`.

Nothing here is used by product code; the plug-ins import slime lazily, inside functions.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["DOUBLE_DIR", "install"]

DOUBLE_DIR = Path(__file__).resolve().parent


def install() -> None:
    """Put the double first on sys.path (idempotent). Refuses to shadow a real slime install."""
    loaded = sys.modules.get("slime")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(DOUBLE_DIR)):
        raise RuntimeError(f"a real slime is already imported ({loaded.__file__}); not installing the double")
    if str(DOUBLE_DIR) not in sys.path:
        sys.path.insert(0, str(DOUBLE_DIR))
