"""Evaluate a served model on prompt data: k multi-turn samples per problem, scored by the eval server.

  python -m tools.eval_model --prompts data/kernelbench.jsonl --out runs/eval/qwen3-8b-base \\
      --backend chat --url http://127.0.0.1:30000/v1 --model qwen3-8b --levels 1,2 -k 4 --max-turns 3
  python -m tools.eval_model ... --backend sglang --url http://127.0.0.1:30000 --tokenizer /models/qwen3-8b
  python -m tools.eval_model --out runs/eval/qwen3-8b-base --report-only     # rebuild the report

Backends: `sglang` drives SGLang's `/generate` token in / token out through the training
episode (needs `--tokenizer`); `chat` drives any OpenAI-compatible `/v1/chat/completions`
endpoint (API key from the environment variable named by `--api-key-env`, if set). The kernel
language is `--kernel-backend triton|cuda` (default: the recipe's `episode.backend`, else triton).
Problems: the prompt jsonl, filtered by `--levels`, `--split` (default holdout; train problems are
refused unless `--allow-train`) and `--problems`; when a split manifest lies beside the prompt file
(`<stem>.split.json`, or `--manifest`), every chosen problem must be in it with that split. Eval server: `--eval-url`, or one is started here
(`--eval-devices`, default auto: GPUs if any, else CPU with no timing).

Output folder: `results.jsonl` (one line per finished sample; re-running the same command resumes,
and a larger -k adds samples), `run.json` (settings), `summary.json`, `report.md`, `fast_p.png`,
`turns.png`. Exit code 0 when every sample is done, 3 when some are not (aborted or stopped by an
endpoint failure; re-run to resume), 130 on Ctrl-C (the report covers what was done), 2 on a
missing or invalid input or setting (as for usage errors), 1 when the eval server could not be
started. See docs/EVAL_REPORTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eval_server.launch import running_server
from eval_server.schema import parse_options
from krl_common.cli import EXIT_USAGE, make_parser
from krl_common.shutdown import interrupt_on_termination, interrupted_exit_code
from krl_common.urls import parse_urls, unreachable
from krl_common.validation import ValidationError
from slime_ext.clients.backends import BACKENDS
from slime_ext.clients.eval_client import EvalClient
from slime_ext.clients.sglang_client import SGLangClient
from slime_ext.data.split import check_reportable, default_manifest_path, load_split_manifest
from slime_ext.reports import runner
from slime_ext.reports.chat_policy import ChatClient, chat_template_kwargs
from slime_ext.reports.report import atomic_write, write_report
from slime_ext.reports.results import ResultsFile, load_results
from slime_ext.rollout.episode import EpisodeConfig
from slime_ext.rollout.problems import load_prompt_records
from slime_ext.rollout.recipe import episode_config_from_recipe, load_recipe

RESULTS_NAME = "results.jsonl"
RUN_NAME = "run.json"
EXIT_INCOMPLETE = 3  # some samples not done: re-run the same command to resume


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("tools.eval_model", __doc__)
    p.add_argument("--out", type=Path, required=True, help="output folder (results, report, plots)")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the folder's results")
    p.add_argument("--prompts", type=Path, help="prompt jsonl (slime_ext/rollout/problems.py format)")
    p.add_argument(
        "--backend",
        choices=("chat", "sglang"),
        default="chat",
        help="chat: an OpenAI-compatible chat API; sglang: a /generate server (token in/out)",
    )
    p.add_argument("--url", help="policy endpoint: chat base URL (…/v1) or SGLang router/engine URL")
    p.add_argument("--model", help="label of the evaluated model (also the chat `model` field by default)")
    p.add_argument("--served-model", help="chat backend: the `model` field to send, if not --model")
    p.add_argument("--tokenizer", help="sglang backend: tokenizer path (the served model's)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="env var holding the chat API key, if any")
    p.add_argument("--levels", type=_int_list, help="e.g. 1,2 (default: all)")
    p.add_argument(
        "--split",
        default="holdout",
        choices=("holdout", "train", "all"),
        help="which problems of the prompt file to evaluate (train/all need --allow-train)",
    )
    p.add_argument("--allow-train", action="store_true", help="allow reporting on train problems")
    p.add_argument(
        "--manifest",
        type=Path,
        help="split manifest to check the problems against (default: <prompts stem>.split.json if it exists)",
    )
    p.add_argument("--problems", help="comma-separated instance_ids or problem_ids")
    p.add_argument("--limit-per-level", type=int, help="first N problems per level")
    p.add_argument("-k", "--samples", type=int, default=1, help="samples per problem")
    p.add_argument(
        "--recipe", type=Path, help="recipe YAML (kernel_rl.episode: prompts, rewards, eval options)"
    )
    p.add_argument(
        "--kernel-backend",
        choices=BACKENDS,
        help="kernel language the model writes (prompts and eval requests); default: the recipe's "
        "episode.backend, else triton",
    )
    p.add_argument("--max-turns", type=int, help="override the recipe's max_turns")
    p.add_argument(
        "--max-new-tokens", type=int, help="per turn; override the recipe's max_new_tokens_per_turn"
    )
    p.add_argument(
        "--eval-options", type=_json_object, help='override eval options, e.g. {"correctness_trials": 2}'
    )
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature")
    p.add_argument("--top-p", type=float, help="nucleus sampling (default: the server's)")
    p.add_argument(
        "--max-context-len", type=int, default=32768, help="sglang backend: prompt + response budget"
    )
    p.add_argument("--sampling-params", type=_json_object, help="extra sampling params (JSON object)")
    p.add_argument("--seed", type=int, help="chat backend: base seed sent with every request")
    p.add_argument("--eval-url", help="running eval server(s), comma-separated; else one is started here")
    p.add_argument("--eval-devices", default="auto", help="for the started eval server: auto, cpu or GPU ids")
    p.add_argument("--eval-workers", type=int, default=2, help="CPU workers of the started eval server")
    p.add_argument("--eval-timeout", type=float, default=900.0, help="seconds to wait for one evaluation")
    p.add_argument("--concurrency", type=int, default=8, help="samples in flight")
    p.add_argument("--pass-k", type=_int_list, help="pass@k values to report (default 1 and k)")
    p.add_argument("--keep-chat", action="store_true", help="store every conversation in the results")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def episode_config(args: argparse.Namespace) -> EpisodeConfig:
    recipe = load_recipe(args.recipe) if args.recipe else None
    config = episode_config_from_recipe(recipe, backend=args.kernel_backend)
    changes: dict[str, Any] = {}
    if args.max_turns is not None:
        changes["max_turns"] = args.max_turns
    if args.max_new_tokens is not None:
        changes["max_new_tokens_per_turn"] = args.max_new_tokens
    if args.eval_options is not None:
        merged = {**dataclasses.asdict(config.eval_options), **args.eval_options}
        changes["eval_options"] = parse_options(merged)
    return dataclasses.replace(config, **changes) if changes else config


def run_settings(args: argparse.Namespace, config: EpisodeConfig) -> dict[str, Any]:
    """Every setting that changes outcomes (the fingerprint), plus the selection (not in it)."""
    outcome = {
        "backend": args.backend,
        "kernel_backend": config.backend,
        "model": args.model,
        "served_model": args.served_model or args.model,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "sampling_params": args.sampling_params or {},
        "max_context_len": args.max_context_len if args.backend == "sglang" else None,
        "seed": args.seed,
        "episode": runner.episode_settings(config),
    }
    return {
        **outcome,
        "config_id": runner.config_fingerprint(outcome),
        "max_turns": config.max_turns,
        "prompts": str(args.prompts),
        "split": args.split,
        "allow_train": args.allow_train,  # asked for knowingly when the run was made
        "levels": args.levels,
        "samples_per_problem": args.samples,
    }


@contextlib.contextmanager
def eval_server_urls(args: argparse.Namespace) -> Iterator[str]:
    if args.eval_url:
        yield args.eval_url
        return
    with tempfile.TemporaryDirectory(prefix="eval-model-") as tmp:
        server_args = ["--devices", args.eval_devices, "--cpu-workers", str(args.eval_workers)]
        print(f"starting eval server ({' '.join(server_args)}) ...", file=sys.stderr, flush=True)
        with running_server(Path(tmp), server_args) as url:
            yield url


def make_policy(
    args: argparse.Namespace, config: EpisodeConfig, evaluator: EvalClient, stack: contextlib.AsyncExitStack
) -> Any:
    extra = dict(args.sampling_params or {})
    if args.backend == "sglang":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        if args.top_p is not None:
            extra["top_p"] = args.top_p
        sglang = SGLangClient(
            args.url,
            temperature=args.temperature,
            max_context_len=args.max_context_len,
            default_max_new_tokens=config.max_new_tokens_per_turn or 8192,
            sampling_params=extra,
        )
        stack.push_async_callback(sglang.aclose)
        return runner.SGLangPolicy(sglang, tokenizer, evaluator, config)
    template = chat_template_kwargs(config)
    if template:
        extra["chat_template_kwargs"] = template
    chat = ChatClient(
        args.url,
        model=args.served_model or args.model,
        temperature=args.temperature,
        max_tokens=config.max_new_tokens_per_turn or 8192,
        top_p=args.top_p,
        extra_body=extra,
        api_key=os.environ.get(args.api_key_env) or None,
    )
    stack.push_async_callback(chat.aclose)
    return runner.ChatPolicy(chat, evaluator, config, seed=args.seed)


async def _evaluate(args, config, problems, results: ResultsFile, eval_url: str) -> runner.RunOutcome:
    async with contextlib.AsyncExitStack() as stack:
        evaluator = EvalClient(eval_url, timeout_s=args.eval_timeout)
        stack.push_async_callback(evaluator.aclose)
        policy = make_policy(args, config, evaluator, stack)
        return await runner.run_evaluation(
            problems,
            args.samples,
            policy,
            results,
            model=args.model,
            concurrency=args.concurrency,
            keep_chat=args.keep_chat,
            progress=not args.no_progress,
        )


def _report(args: argparse.Namespace, run: dict[str, Any], max_turns: int | None) -> dict[str, Path]:
    if not (args.out / RESULTS_NAME).is_file():  # the run stopped before any sample finished
        print("no sample finished: no report written", file=sys.stderr)
        return {}
    records = load_results(args.out / RESULTS_NAME)
    # --report-only on a folder made with --allow-train: the run's own setting stands
    runner.check_splits(records, allow_train=args.allow_train or bool(run.get("allow_train")))
    written = write_report(
        args.out, records, run, ks=args.pass_k, max_turns=max_turns, plots=not args.no_plots
    )
    for path in written.values():
        print(f"wrote {path}", file=sys.stderr)
    return written


def _check_args(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    missing = [f for f in ("prompts", "url", "model") if getattr(args, f) is None]
    if missing:
        p.error(
            f"missing {', '.join('--' + m.replace('_', '-') for m in missing)} (needed unless --report-only)"
        )
    if args.backend == "sglang" and not args.tokenizer:
        p.error("--backend sglang needs --tokenizer (the served model's tokenizer path)")
    if args.samples < 1 or args.concurrency < 1:
        p.error("-k and --concurrency must be >= 1")


def _check_reachable(args: argparse.Namespace) -> None:
    """After the local inputs, before any eval server starts or any row is written: an endpoint
    nothing answers at is one line naming the flag and the URL."""
    endpoints = [("--url", args.url)] + [
        ("--eval-url", u) for u in parse_urls(args.eval_url or "", allow_empty=True)
    ]
    for flag, url in endpoints:
        if (why := unreachable(url)) is not None:
            raise ValueError(f"{flag} {url}: {why}")


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    # SIGTERM/SIGHUP take the Ctrl-C path: the embedded eval server is stopped, the report written.
    interrupt_on_termination()
    try:
        if args.report_only:
            run_path = args.out / RUN_NAME
            if not run_path.is_file():
                raise FileNotFoundError(f"{run_path} not found: is {args.out} an eval_model output folder?")
            run = json.loads(run_path.read_text(encoding="utf-8"))
            if not (args.out / RESULTS_NAME).is_file():  # _report would say "no sample finished"
                raise FileNotFoundError(f"results file not found: {args.out / RESULTS_NAME}")
            _report(args, run, run.get("max_turns"))
            return 0
        _check_args(args, p)
        config = episode_config(args)
        problems = runner.select_problems(
            load_prompt_records(args.prompts),
            split=args.split,
            levels=args.levels,
            ids=[i.strip() for i in args.problems.split(",") if i.strip()] if args.problems else None,
            limit_per_level=args.limit_per_level,
            allow_train=args.allow_train,
        )
        manifest_path = args.manifest or default_manifest_path(args.prompts)
        if args.manifest is not None or manifest_path.is_file():
            # The records' split chose the problems; the manifest, when there is one, must agree.
            check_reportable(load_split_manifest(manifest_path), problems, allow_train=args.allow_train)
        _check_reachable(args)
        run = run_settings(args, config)
        results = ResultsFile(args.out / RESULTS_NAME, run["config_id"])
        if results.dropped_partial_line:
            print("results: dropped an unfinished last line (interrupted write)", file=sys.stderr)
        atomic_write(args.out / RUN_NAME, json.dumps(run, indent=1) + "\n")
        done = results.done()
        n_done = sum((r.instance_id, i) in done for r in problems for i in range(args.samples))
        print(
            f"{len(problems)} problem(s) x {args.samples} sample(s), {n_done} already done", file=sys.stderr
        )
        try:
            if n_done == len(problems) * args.samples:  # nothing to do: no eval server, no policy
                outcome = runner.RunOutcome(planned=0, skipped=n_done)
            else:
                with eval_server_urls(args) as eval_url:
                    outcome = asyncio.run(_evaluate(args, config, problems, results, eval_url))
        except KeyboardInterrupt:
            # Every finished sample is already on disk: report those, say how to go on.
            _report(args, run, config.max_turns)
            print("interrupted: re-run the same command to resume", file=sys.stderr)
            return interrupted_exit_code()
        _report(args, run, config.max_turns)
    except (ValidationError, ValueError, FileNotFoundError) as exc:  # the input or settings
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, RuntimeError) as exc:  # RuntimeError: eval server start
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"done: {outcome.finished} written ({outcome.aborted} aborted), {outcome.skipped} skipped "
        f"(done before), {outcome.planned - outcome.finished} not done",
        file=sys.stderr,
    )
    for err in outcome.errors:
        print(f"stopped: {err}", file=sys.stderr)
    if not outcome.complete:
        print("incomplete: re-run the same command to resume", file=sys.stderr)
        return EXIT_INCOMPLETE
    return 0


if __name__ == "__main__":
    sys.exit(main())
