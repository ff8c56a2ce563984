"""Warm-start SFT data from the bundled sample problems (slime_ext/data/sample_sft.py): for each
problem its first prompt, as the RL episode renders it, answered once correctly and once wrongly;
and (`--fixer`, the default) two-turn fixer examples: each wrong candidate, the evaluator's real
feedback on it, then the correct kernel, so the warm-started model has seen a second turn fix.

  python -m tools.prepare_sample_sft --output data/sample_sft.jsonl [--problems relu softmax] \\
      [--repeat 8] [--recipe configs/recipe/kernelbench_multiturn.yaml] \\
      [--eval-url http://127.0.0.1:18188 | --eval-devices cpu] [--no-fixer]

The fixer examples' feedback comes from an eval server: `--eval-url`, else one this command starts
on `--eval-devices` (default cpu: wrong answers fail before any timing, so a CPU evaluator gives
the feedback a GPU one would, less the GPU's name) and stops. Exit codes: 0 written, 2 bad
arguments, 3 the eval server failed (nothing written).

The prompt wording comes from the recipe's episode.prompt, by default the launcher's default
recipe (RECIPE in configs/run/common.sh): the SFT prompts must be the RL run's, token for token
(a warm start on prompts without the recipe's one-shot example wrote no code at all when the RL
run showed it the example, H100, 2026-11-27). Pass the run's RECIPE when it is another. The
output is slime's SFT jsonl (`messages`, docs/DATA.md), read by scripts/run_sft.sh (SFT_DATA=...).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from eval_server.schema import EvalResult
from krl_common.cli import EXIT_USAGE, make_parser
from slime_ext.clients.eval_client import EvalClient, EvalClientError
from slime_ext.data.sample_sft import (
    fixer_examples,
    problems_with_wrong_answers,
    sample_sft_examples,
    wrong_candidates,
)
from slime_ext.data.sft_format import write_sft_jsonl
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.recipe import episode_config_from_recipe, load_recipe

# The launcher's default RECIPE (configs/run/common.sh), in this checkout.
DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "recipe" / "kernelbench_multiturn.yaml"


async def _evaluate(
    names: Sequence[str], url: str, episode: EpisodeConfig, timeout_s: float
) -> dict[str, EvalResult]:
    """The eval server's result for every bundled wrong candidate of `names` (Triton kernels)."""
    from eval_server import samples

    out = {}
    async with EvalClient(url, timeout_s=timeout_s) as client:
        for problem, cand in wrong_candidates(names):
            out[cand] = await client.evaluate_source(
                samples.load_problem(problem), samples.load_candidate(cand),
                options=episode.eval_options, problem_id=problem, backend="triton",
            )  # fmt: skip
    return out


def _results(names: Sequence[str], args: argparse.Namespace, episode: EpisodeConfig) -> dict[str, EvalResult]:
    if args.eval_url:
        return asyncio.run(_evaluate(names, args.eval_url, episode, args.eval_timeout))
    from eval_server.launch import running_server

    with (
        tempfile.TemporaryDirectory(prefix="prepare-sample-sft-") as tmp,
        running_server(Path(tmp), ["--devices", args.eval_devices]) as url,
    ):
        return asyncio.run(_evaluate(names, url, episode, args.eval_timeout))


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.prepare_sample_sft", __doc__)
    p.add_argument("--output", type=Path, required=True, help="SFT jsonl to write")
    p.add_argument(
        "--problems", nargs="*", help="bundled sample problems (default: those with bundled wrong candidates)"
    )
    p.add_argument(
        "--mutations",
        action="store_true",
        help="a problem without a bundled wrong candidate gets an unverified mutation of its kernel",
    )
    p.add_argument("--repeat", type=int, default=1, help="copies of each (correct, wrong) pair")
    p.add_argument(
        "--recipe",
        type=Path,
        default=DEFAULT_RECIPE,
        help="run recipe whose episode.prompt words the prompt (default: the launcher's, %(default)s)",
    )
    p.add_argument(
        "--fixer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="add two-turn fixer examples (wrong answer, its real feedback, the correct kernel)",
    )
    p.add_argument("--eval-url", help="eval server for the fixer examples' feedback (default: start one)")
    p.add_argument(
        "--eval-devices", default="cpu", help="--devices of the eval server started without --eval-url"
    )
    p.add_argument("--eval-timeout", type=float, default=600.0, help="seconds per evaluation")
    args = p.parse_args(argv)
    from slime_ext.dev_engine.scripted import sample_names

    try:
        names = sample_names(args.problems) if args.problems else problems_with_wrong_answers()
        episode = episode_config_from_recipe(load_recipe(args.recipe))
        examples = sample_sft_examples(names, episode.prompt, repeat=args.repeat, mutations=args.mutations)
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    left_out: dict[str, str] = {}
    if args.fixer:
        try:
            results = _results(names, args, episode)
        except (EvalClientError, RuntimeError, OSError) as exc:
            print(f"error: the eval server failed ({exc}); nothing written", file=sys.stderr)
            return 3
        fixes, left_out = fixer_examples(names, episode.prompt, results, repeat=args.repeat)
        examples += fixes
    n = write_sft_jsonl(args.output, examples)
    turns = Counter(e.metadata.get("turns", 1) for e in examples)
    correct = Counter(e.metadata["correct"] for e in examples if e.metadata.get("turns", 1) == 1)
    unverified = sorted({e.metadata["candidate"] for e in examples if not e.metadata["status_verified"]})
    print(
        f"wrote {n} examples ({correct[True]} correct, {correct[False]} wrong first answers, {turns[2]} "
        f"two-turn fixes) for {len(names)} problems to {args.output}"
        + (f"; wrong by mutation, not verified: {', '.join(unverified)}" if unverified else "")
        + "".join(f"; no fixer example from {c}: {why}" for c, why in sorted(left_out.items()))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
