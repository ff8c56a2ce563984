"""KernelBook (Triton) or the AI CUDA Engineer Archive (CUDA) -> slime SFT data (`messages` jsonl)
with filters, dedup and a report.

  python -m tools.prepare_kernelbook_sft --input KernelBook/dataset_permissive.parquet \\
      --output data/sft.jsonl --exclude-problems data/kernelbench.jsonl
  # keep only answers that pass a running eval server, and add two-turn examples whose second
  # turn carries the server's real feedback on a failing first attempt:
  python -m tools.prepare_kernelbook_sft --input kb.parquet --output data/sft.jsonl \\
      --verify-url http://127.0.0.1:18188 --mutate --attempts model_attempts.jsonl
  # CUDA C++ answers from SakanaAI/AI-CUDA-Engineer-Archive (level_*.parquet), best 4 per task
  # (python -m tools.prepare_cuda_sft is the same as --backend cuda):
  python -m tools.prepare_kernelbook_sft --backend cuda --input AI-CUDA-Engineer-Archive/ \\
      --output data/sft_cuda.jsonl --exclude-problems data/kb_holdout.jsonl --per-task 4

Prompts are built exactly as in RL (`slime_ext.rollout.prompts.build_messages`, in the backend's wording;
the prompt section of `--recipe` if given). The backend is `--backend`, else the recipe's
`episode.backend`, else triton. The report (`<output stem>.report.json` unless --report) counts every
dropped row by reason; the same table is printed. Outputs are written atomically. Exit codes:
0 written, 1 no example survived (report still written), 2 bad arguments or input,
3 the eval server failed (unavailable, timeout); nothing is written then.
See docs/DATA.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eval_server.schema import EvalOptions
from krl_common.cli import make_parser
from krl_common.validation import ValidationError
from slime_ext.clients.backends import BACKENDS, CUDA, DEFAULT_BACKEND
from slime_ext.clients.eval_client import EvalClient, EvalClientError
from slime_ext.data.files import TABLE_SUFFIXES, atomic_write_text, read_rows
from slime_ext.data.kernelbook import canonical_hash
from slime_ext.data.report import FilterReport
from slime_ext.data.sakana import select_archive_pairs
from slime_ext.data.sft_build import (
    Attempt,
    SFTBuildConfig,
    limit_tokens,
    select_pairs,
    single_turn_example,
    token_counter,
)
from slime_ext.data.sft_format import SFTExample, write_sft_jsonl
from slime_ext.data.sft_verify import load_attempts, multi_turn_examples, mutation_attempts, verify_pairs
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.problems import PromptRecord, load_prompt_records
from slime_ext.rollout.recipe import episode_config_from_recipe, load_recipe


def build_parser(
    prog: str = "tools.prepare_kernelbook_sft", doc: str | None = __doc__
) -> argparse.ArgumentParser:
    p = make_parser(prog, doc)
    p.add_argument(
        "--input",
        required=True,
        help=f"KernelBook / archive file ({', '.join(TABLE_SUFFIXES)}) or a folder of them",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="triton: KernelBook rows; cuda: AI CUDA Engineer Archive rows (default: the recipe's, else triton)",
    )
    p.add_argument(
        "--per-task",
        type=int,
        default=4,
        help="cuda: keep the N fastest kernels of each KernelBench task (0: all)",
    )
    p.add_argument(
        "--min-archive-speedup",
        type=float,
        default=None,
        help="cuda: drop kernels the archive measured slower than this (CUDA_Speedup_Native)",
    )
    p.add_argument("--output", required=True, help="SFT jsonl to write")
    p.add_argument("--report", default=None, help="report JSON (default: <output stem>.report.json)")
    p.add_argument(
        "--recipe", default=None, help="recipe YAML: prompt wording and eval options of the RL run"
    )
    p.add_argument("--limit", type=int, default=None, help="read only the first N rows")
    p.add_argument(
        "--max-reference-chars",
        type=int,
        default=SFTBuildConfig.max_reference_chars,
        help="skip rows whose PyTorch reference is longer",
    )
    p.add_argument(
        "--max-answer-chars",
        type=int,
        default=SFTBuildConfig.max_answer_chars,
        help="skip rows whose answer is longer",
    )
    p.add_argument(
        "--allow-extern-kernels",
        action="store_true",
        help="keep answers computing with torch/cuBLAS (Inductor extern_kernels; torch::/at:: calls in CUDA)",
    )
    p.add_argument("--no-dedup", action="store_true", help="keep duplicate modules")
    p.add_argument("--tokenizer", default=None, help="local tokenizer dir: enables --max-tokens")
    p.add_argument(
        "--max-tokens", type=int, default=None, help="drop examples longer than this (chat-rendered)"
    )
    p.add_argument(
        "--exclude-problems",
        action="append",
        default=[],
        metavar="PROMPTS_JSONL",
        help="drop modules identical to these prompt records' references (repeatable)",
    )
    p.add_argument(
        "--verify-url", default=None, help="eval server URL(s), comma-separated: keep passing answers"
    )
    p.add_argument(
        "--min-speedup",
        type=float,
        default=None,
        help="with --verify-url: keep answers at least this fast (timed)",
    )
    p.add_argument("--jobs", type=int, default=1, help="processes for the per-row conversion and checks (1)")
    p.add_argument("--concurrency", type=int, default=4, help="evaluations in flight (4)")
    p.add_argument("--correctness-trials", type=int, default=None, help="override the eval options' trials")
    p.add_argument("--eval-timeout", type=float, default=600.0, help="seconds to wait for one evaluation")
    p.add_argument("--eval-retries", type=int, default=5, help="retries when no server accepts a request (5)")
    p.add_argument("--attempts", default=None, help="failing first attempts: table of {key, candidate}")
    p.add_argument("--mutate", action="store_true", help="make first attempts by flipping a kernel operator")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _input_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES)
        if files:
            return files
        raise ValidationError(f"{path}: no {', '.join(TABLE_SUFFIXES)} files in this folder")
    raise FileNotFoundError(f"KernelBook input not found: {path}")


def _rows(files: list[Path], limit: int | None) -> Iterator[dict[str, Any]]:
    n = 0
    for f in files:
        for row in read_rows(f):
            if limit is not None and n >= limit:
                return
            n += 1
            yield row


def _kernelbench_tasks(records: list[PromptRecord]) -> frozenset[tuple[int, int]]:
    """(level, KernelBench problem number) of prompt records made by tools.prepare_kernelbench:
    the archive names its tasks so, whatever the formatting of its copy of the module."""
    return frozenset(
        (r.level, int(r.metadata["kernelbench_problem_id"]))
        for r in records
        if isinstance(r.metadata.get("kernelbench_problem_id"), int)
    )


def _settings(args: argparse.Namespace) -> tuple[EpisodeConfig, EvalOptions, dict[str, Any]]:
    """The episode settings (backend, prompt wording), eval options and chat-template variables:
    the recipe's episode section when --recipe is given (the RL run's own settings), else the
    defaults; --backend wins over the recipe's."""
    if args.recipe:
        episode = episode_config_from_recipe(load_recipe(args.recipe), backend=args.backend)
    else:
        episode = EpisodeConfig(
            backend=args.backend or DEFAULT_BACKEND,
            eval_options=EvalOptions(correctness_trials=3, timing=False),
        )
    options = episode.eval_options
    if args.correctness_trials is not None:
        options = dataclasses.replace(options, correctness_trials=args.correctness_trials)
    if args.min_speedup is not None:
        options = dataclasses.replace(options, timing=True)  # a speedup needs the answer timed
    template_kwargs = dict(episode.chat_template_kwargs or {})
    if episode.enable_thinking is not None:
        template_kwargs["enable_thinking"] = episode.enable_thinking
    return episode, options, template_kwargs


async def _evaluate_stages(
    args: argparse.Namespace, pairs: list, episode: EpisodeConfig, options: EvalOptions, report: FilterReport
) -> tuple[list, list[SFTExample]]:
    attempts: list[Attempt] = load_attempts(args.attempts) if args.attempts else []
    async with EvalClient(
        args.verify_url, timeout_s=args.eval_timeout, max_retries=args.eval_retries
    ) as client:
        verified = await verify_pairs(
            pairs,
            client,
            options,
            report,
            min_speedup=args.min_speedup,
            concurrency=args.concurrency,
            progress=not args.no_progress,
            backend=episode.backend,
        )
        if args.mutate:
            attempts += mutation_attempts(verified)
        multi = await multi_turn_examples(
            verified,
            attempts,
            client,
            options,
            episode.prompt,
            report,
            concurrency=args.concurrency,
            progress=not args.no_progress,
            backend=episode.backend,
        )
    return verified, multi


def run(args: argparse.Namespace) -> int:
    if (args.tokenizer is None) != (args.max_tokens is None):
        raise ValidationError("--tokenizer and --max-tokens go together")
    if args.min_speedup is not None and not args.verify_url:
        raise ValidationError("--min-speedup needs --verify-url (a GPU eval server times the answers)")
    if (args.attempts or args.mutate) and not args.verify_url:
        raise ValidationError(
            "--attempts/--mutate need --verify-url: multi-turn feedback must come from the evaluator"
        )
    if args.per_task < 0:
        raise ValidationError("--per-task must be >= 0 (0 keeps every kernel)")
    episode, options, template_kwargs = _settings(args)
    prompt = episode.prompt
    records = [r for path in args.exclude_problems for r in load_prompt_records(path)]
    exclude = frozenset(canonical_hash(r.reference) for r in records)
    config = SFTBuildConfig(
        max_reference_chars=args.max_reference_chars,
        max_answer_chars=args.max_answer_chars,
        allow_extern_kernels=args.allow_extern_kernels,
        dedup=not args.no_dedup,
        exclude_hashes=exclude,
        prompt=prompt,
    )
    report = FilterReport()
    report.settings = {
        "input": args.input,
        "backend": episode.backend,
        "max_reference_chars": config.max_reference_chars,
        "max_answer_chars": config.max_answer_chars,
        "allow_extern_kernels": config.allow_extern_kernels,
        "dedup": config.dedup,
        "excluded_problems": len(exclude),
        "verify_url": args.verify_url,
        "eval_options": dataclasses.asdict(options) if args.verify_url else None,
        "min_speedup": args.min_speedup,
        "mutate": args.mutate,
        "attempts": args.attempts,
        "tokenizer": args.tokenizer,
        "max_tokens": args.max_tokens,
    }
    rows = _rows(_input_files(Path(args.input)), args.limit)
    if episode.backend == CUDA:
        report.settings.update(per_task=args.per_task, min_archive_speedup=args.min_archive_speedup)
        pairs = select_archive_pairs(
            rows,
            config,
            report,
            where=args.input,
            per_task=args.per_task or None,
            min_archive_speedup=args.min_archive_speedup,
            exclude_tasks=_kernelbench_tasks(records),
        )
    else:
        pairs = select_pairs(rows, config, report, where=args.input, jobs=args.jobs)
    verified, multi = pairs, []
    if args.verify_url:
        verified, multi = asyncio.run(_evaluate_stages(args, pairs, episode, options, report))
    by_key: dict[str, list[SFTExample]] = {}
    for example in multi:
        by_key.setdefault(example.metadata["key"], []).append(example)
    examples: list[SFTExample] = []
    for pair in verified:
        examples.append(single_turn_example(pair, prompt, verified=bool(args.verify_url)))
        examples.extend(by_key.get(pair.key, []))
    if args.tokenizer:
        count = token_counter(args.tokenizer, template_kwargs)
        examples = limit_tokens(examples, count, args.max_tokens, report)
    report.kept = sum(1 for e in examples if e.turns == 1)
    report.multi_turn = sum(1 for e in examples if e.turns > 1)
    report_path = (
        Path(args.report)
        if args.report
        else Path(args.output).with_name(f"{Path(args.output).stem}.report.json")
    )
    atomic_write_text(report_path, json.dumps(report.to_json(), indent=2) + "\n")
    print(report.table())
    if not examples:
        print(f"no example survived the filters; nothing written (report: {report_path})", file=sys.stderr)
        return 1
    write_sft_jsonl(args.output, examples)
    print(f"wrote {len(examples)} SFT examples to {args.output}; report {report_path}")
    return 0


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    args = (parser or build_parser()).parse_args(argv)
    try:
        return run(args)
    except (ValidationError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except EvalClientError as exc:  # the evaluator is down or timed out: says nothing about the data
        print(f"error: eval server: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
