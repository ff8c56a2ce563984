"""Run slime's REAL `parse_args` on a trainer command line, in its own process (slime parses
`sys.argv` and Megatron keeps global state), and print the resulting arguments as JSON.

    python -m tests.real_slime_parse_args OUT.json -- train.py-args...

Used by tests/integration/test_real_slime_args.py; the sources come from SLIME_SRC / MEGATRON_SRC
(tests/real_slime.py). On a machine without a GPU two facts are supplied, as the brief for these
tests allows: `CUDA_DEVICE_MAX_CONNECTIONS=1` (set by slime's own run scripts for the Ray job) and
the GPU-architecture query that Megatron's validation makes (answered as a Hopper GPU, compute
capability 9.0, the recipe's target). Where SGLang and its router are installed (the slime image),
`parse_args` runs whole; where they are not, their modules are the labelled stand-ins of
tests/real_slime.py and the process runs the Megatron + slime half of `parse_args` (the same
calls, in the same order, minus SGLang's parser and validation) and reports that it did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

KEYS = (
    "rollout_function_path", "eval_function_path", "custom_generate_function_path", "custom_rm_path",
    "custom_reward_post_process_path", "custom_rollout_log_function_path",
    "custom_eval_rollout_log_function_path", "custom_config_path", "advantage_estimator",
    "rewards_normalization", "grpo_std_normalization", "n_samples_per_prompt", "rollout_batch_size",
    "global_batch_size", "rollout_temperature", "rollout_max_context_len", "eval_interval",
    "tensor_model_parallel_size", "context_parallel_size", "colocate", "debug_train_only",
    "input_key", "loss_type", "kernel_rl", "sglang_mem_fraction_static", "sglang_router_port",
    "override_opt_param_scheduler", "use_checkpoint_opt_param_scheduler",
)  # fmt: skip


def _answer_gpu_queries() -> None:
    """No GPU here: Megatron's validation asks for the device's compute capability."""
    from types import SimpleNamespace

    import torch

    hopper = SimpleNamespace(major=9, minor=0, name="NVIDIA H100 80GB HBM3 (CPU test: no GPU queried)")
    torch.cuda.get_device_capability = lambda device=None: (hopper.major, hopper.minor)
    torch.cuda.get_device_properties = lambda device=None: hopper


def _sglang_installed() -> bool:
    from tests.real_slime import _installed

    return _installed("sglang.srt.server_args") and _installed("sglang_router.launch_router")


def _record_leftovers() -> list[list[str]]:
    """Each parser's unparsed flags (slime's parsers ignore unknown ones: Megatron's with
    `ignore_unknown_args=True`, SGLang's with `parse_known_args`); a flag left by every parser
    that saw the whole command line is one nothing recognised."""
    leftovers: list[list[str]] = []
    real = argparse.ArgumentParser.parse_known_args

    def recording(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        ns, rest = real(self, args, namespace)
        if args is None:  # parsed sys.argv: the whole command line
            leftovers.append([a.split("=")[0] for a in rest if a.startswith("--")])
        return ns, rest

    argparse.ArgumentParser.parse_known_args = recording  # type: ignore[method-assign]
    return leftovers


def parse(argv: list[str]) -> tuple[Any, bool]:
    """(slime's args for `argv`, whether SGLang's half ran)."""
    from tests.real_slime import _stand_ins, megatron_src, slime_src

    sys.path[:0] = [str(slime_src()), str(megatron_src())]
    full = _sglang_installed()
    for name, module in _stand_ins().items():
        sys.modules.setdefault(name, module)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    _answer_gpu_queries()
    sys.argv = ["train.py", *argv]
    from slime.utils import arguments

    if full:
        return arguments.parse_args(), True
    # parse_args without its SGLang phases (slime/utils/arguments.py, phase 2 and validation)
    from slime.backends.megatron_utils.arguments import megatron_parse_args
    from slime.backends.megatron_utils.arguments import validate_args as megatron_validate_args

    pre = arguments._pre_parse_mode()
    args = megatron_parse_args(
        extra_args_provider=arguments.get_slime_extra_args_provider(None),
        skip_hf_validate=pre.debug_rollout_only,
    )
    for key, value in vars(pre).items():
        setattr(args, key, value)
    arguments.slime_validate_args(args)
    if pre.train_backend == "megatron" and not args.debug_rollout_only:
        megatron_validate_args(args)
    return args, False


def main() -> None:
    out, sep, *argv = sys.argv[1:]
    assert sep == "--", "usage: python -m tests.real_slime_parse_args OUT.json -- ARGS..."
    leftovers = _record_leftovers()
    args, full = parse(argv)
    values = {k: getattr(args, k, None) for k in KEYS}
    unknown = sorted(set.intersection(*map(set, leftovers))) if leftovers else []
    report = {"sglang_parsed": full, "args": values, "unrecognised": unknown}
    Path(out).write_text(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
