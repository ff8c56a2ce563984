"""Optimizer-role SFT examples from pairs of a slower and a faster correct kernel per problem
(slime_ext/data/optimizer_sft.py): both are evaluated by the eval server WITH timing (a GPU
evaluator), and a pair is kept when both are correct and the faster one's speedup beats the slower
one's by --min-gain; the example is prompt -> slower kernel (context) -> its real feedback handed to
the optimizer (the recipe's wording) -> the faster kernel (trained).

  python -m tools.prepare_optimizer_sft --pairs pairs.jsonl --output data/optimizer_sft.jsonl \\
      --eval-url http://127.0.0.1:18188 [--recipe configs/recipe/kernelbench_multiturn.yaml]

pairs.jsonl: one {"key", "reference", "slower", "faster"} per line (module sources). Exit codes:
0 written, 1 no pair kept (e.g. an evaluator without timing: every pair is `untimed`), 2 bad
arguments or input, 3 the eval server failed (down or timed out; nothing written).
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

from krl_common.cli import EXIT_USAGE, make_parser
from slime_ext.clients.eval_client import EvalClient, EvalClientError, EvalRequestError
from slime_ext.data.files import iter_jsonl
from slime_ext.data.optimizer_sft import KernelPair, optimizer_example, pair_verdict, parse_kernel_pair
from slime_ext.data.sft_format import SFTExample, write_sft_jsonl
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.recipe import episode_config_from_recipe, load_recipe
from tools.prepare_sample_sft import DEFAULT_RECIPE


async def _examples(
    pairs: list[KernelPair], url: str, episode: EpisodeConfig, min_gain: float, timeout_s: float, concurrency: int
) -> tuple[list[SFTExample], Counter[str]]:
    verdicts: Counter[str] = Counter()
    gate = asyncio.Semaphore(max(1, concurrency))
    async with EvalClient(url, timeout_s=timeout_s) as client:

        async def one(pair: KernelPair) -> SFTExample | None:
            async with gate:
                try:
                    slower, faster = [
                        await client.evaluate_source(
                            pair.reference, src, options=episode.eval_options, problem_id=pair.key,
                            backend=episode.backend,
                        )
                        for src in (pair.slower, pair.faster)
                    ]  # fmt: skip
                except EvalRequestError:  # the server refused a source (e.g. over its size limit)
                    verdicts["refused"] += 1
                    return None
            why = pair_verdict(slower, faster, min_gain)
            verdicts[why or "kept"] += 1
            return None if why else optimizer_example(pair, slower, faster, episode.prompt)

        results = await asyncio.gather(*(one(p) for p in pairs))
    return [e for e in results if e is not None], verdicts


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.prepare_optimizer_sft", __doc__)
    p.add_argument("--pairs", type=Path, required=True, help="jsonl of {key, reference, slower, faster}")
    p.add_argument("--output", type=Path, required=True, help="SFT jsonl to write")
    p.add_argument("--eval-url", required=True, help="eval server (a GPU one: the pairs are ordered by timing)")
    p.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE, help="run recipe: prompt wording, eval options")
    p.add_argument("--min-gain", type=float, default=0.05, help="faster speedup >= slower x (1 + this)")
    p.add_argument("--eval-timeout", type=float, default=900.0, help="seconds per evaluation")
    p.add_argument("--concurrency", type=int, default=4, help="pairs evaluated at once")
    args = p.parse_args(argv)
    try:
        pairs = [parse_kernel_pair(d, f"{args.pairs}:{n}") for n, d in iter_jsonl(args.pairs)]
        episode = episode_config_from_recipe(load_recipe(args.recipe))
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        examples, verdicts = asyncio.run(
            _examples(pairs, args.eval_url, episode, args.min_gain, args.eval_timeout, args.concurrency)
        )
    except EvalClientError as exc:
        print(f"error: the eval server failed ({exc}); nothing written", file=sys.stderr)
        return 3
    print(f"{len(pairs)} pairs: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())))
    if not examples:
        print("no pair kept: nothing written", file=sys.stderr)
        return 1
    write_sft_jsonl(args.output, examples)
    print(f"wrote {len(examples)} optimizer examples to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
