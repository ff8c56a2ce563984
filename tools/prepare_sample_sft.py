"""Warm-start SFT data from the bundled sample problems (slime_ext/data/sample_sft.py): for each
problem its first prompt, as the RL episode renders it, answered once correctly and once wrongly.

  python -m tools.prepare_sample_sft --output data/sample_sft.jsonl [--problems relu softmax] \\
      [--repeat 8] [--recipe configs/recipe/kernelbench_multiturn.yaml]

The prompt wording comes from the recipe's episode.prompt, by default the launcher's default
recipe (RECIPE in configs/run/common.sh): the SFT prompts must be the RL run's, token for token
(a warm start on prompts without the recipe's one-shot example wrote no code at all when the RL
run showed it the example, H100, 2026-11-27). Pass the run's RECIPE when it is another. The
output is slime's SFT jsonl (`messages`, docs/DATA.md), read by scripts/run_sft.sh (SFT_DATA=...).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from krl_common.cli import EXIT_USAGE, make_parser
from slime_ext.data.sample_sft import problems_with_wrong_answers, sample_sft_examples
from slime_ext.data.sft_format import write_sft_jsonl
from slime_ext.rollout.recipe import episode_config_from_recipe, load_recipe

# The launcher's default RECIPE (configs/run/common.sh), in this checkout.
DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "configs" / "recipe" / "kernelbench_multiturn.yaml"


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
    args = p.parse_args(argv)
    from slime_ext.dev_engine.scripted import sample_names

    try:
        names = sample_names(args.problems) if args.problems else problems_with_wrong_answers()
        prompt = episode_config_from_recipe(load_recipe(args.recipe)).prompt
        examples = sample_sft_examples(names, prompt, repeat=args.repeat, mutations=args.mutations)
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    n = write_sft_jsonl(args.output, examples)
    correct = Counter(e.metadata["correct"] for e in examples)
    unverified = sorted({e.metadata["candidate"] for e in examples if not e.metadata["status_verified"]})
    print(
        f"wrote {n} examples ({correct[True]} correct, {correct[False]} wrong) for {len(names)} problems "
        f"to {args.output}"
        + (f"; wrong by mutation, not verified: {', '.join(unverified)}" if unverified else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
