"""A small generation engine that speaks SGLang's native `/generate` protocol, for plumbing runs.

Not SGLang: it serves any local Hugging Face causal LM directory (e.g. the tiny model that
`python -m slime_ext.dev_engine.tiny_model --out DIR` writes) one request at a time, on the CPU by default
(`--device cuda[:N]` and `--dtype bfloat16` put it on a GPU), so the CPU dry run
(`python -m tools.dry_run`) and GPU runs of the trainer against a tiny model exercise the real
token-in/token-out path of the agent runner. Any server of the same protocol (a real SGLang
router) can replace it.

Protocol (`slime_interfaces.md` section 3):
- `POST /generate` `{"input_ids": [...] | "text": str, "sampling_params": {...},
  "return_logprob": bool}` ->
  `{"text", "meta_info": {"output_token_logprobs": [[logprob, token_id, token_text], ...],
  "finish_reason": {"type": "stop", "matched": id|str} | {"type": "length", "length": n} |
  {"type": "abort", "message": ...}, "prompt_tokens", "completion_tokens"}}`.
  `output_token_logprobs` is present only with `return_logprob`; `meta_info.scripted` is present
  only on a scripted answer (below). Replies are standard JSON only: a log-prob of -inf (or any
  non-finite float) is written as `null`, never `-Infinity`.
- `GET /health`, `GET /health_generate`: 200 once the model is loaded (`{"status": "ok"}`, plus
  `"scripted"` in scripted mode). `GET /get_model_info` (also names the device, dtype and any
  scripted mode).

Sampling: token by token with `torch.multinomial` over `softmax(logits / temperature)`, restricted
by `top_k` / `top_p` when set; the returned log-prob of a token is `log_softmax(logits /
temperature)` at that token (what slime's trainer recomputes). Generation stops after a stop token
(the tokenizer's EOS, `<|im_end|>` / `<|endoftext|>` when present, plus `stop_token_ids`), which
is included in the output as SGLang does with `no_stop_trim`; after the decoded output ends with
one of the `stop` strings; or after `max_new_tokens` (finish `length`).
Sampling params that change nothing here (`no_stop_trim`, `skip_special_tokens`, ...) are
accepted; unknown ones are rejected with 400 naming the key, as SGLang's SamplingParams does.

SCRIPTED MODE (labelled; not a model's answers): with `--scripted FILE` (jsonl of
`{"match": str, "text": str, "correct": bool, "label": str}`, `slime_ext/dev_engine/scripted.py`), a request
whose decoded context contains an answer's `match` is answered with the first correct answer's
`text` followed by the end-of-turn token, cut to `max_new_tokens` (finish `length`) and with each
token's teacher-forced log-prob under the same temperature, so the log-prob contract still holds;
other requests are sampled. The dry run's `--scripted` uses it to send known candidates through
the eval server deterministically. MIXED: `--scripted-mix P` answers with a correct answer with
probability P and a wrong one otherwise, drawn per request from (`--seed`, input ids, how many
requests with the same ids came before), so runs are reproducible and the samples of one GRPO
group differ; each turn draws anew. Without `--scripted FILE` it uses the bundled sample problems'
answers (`slime_ext.dev_engine.scripted.sample_answers`: correct candidate; wrong: incorrect or
non-compiling bundled candidates, and an answer without code). A scripted response carries
`meta_info.scripted = {"mode": "scripted" | "scripted-mix", "correct", "label", "p"}`; the startup
log line, `/health` and `/get_model_info` say so too.

CLI: `python -m slime_ext.dev_engine.engine --model DIR [--host 127.0.0.1] [--port 30000] [--seed S]
[--device cpu|cuda|cuda:N] [--dtype float32|bfloat16] [--scripted FILE] [--scripted-mix P]`.
"""

from __future__ import annotations

import collections
import inspect
import json
import logging
import signal
import threading
from collections.abc import Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from krl_common import fastjson
from krl_common.cli import make_parser
from krl_common.fileio import missing_local_dir
from krl_common.shutdown import ensure_port_free, exit_port_in_use, is_address_in_use
from slime_ext.dev_engine.scripted import (
    ScriptedAnswer,
    choose_answer,
    context_key,
    load_scripted_rules,
    mix_draw,
    read_answers,
    sample_answers,
)

__all__ = ["DTYPES", "GenerateEngine", "Produced", "load_engine", "load_scripted_rules", "main"]

log = logging.getLogger("slime_ext.dev_engine.engine")

# What one generation produced: token ids, their log-probs, the finish_reason object.
Produced = tuple[list[int], list[float], dict[str, Any]]

_KNOWN_PARAMS = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "no_stop_trim",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "sampling_seed",
    "custom_params",
    "n",
}
_DEFAULT_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
_MAX_NEW_DEFAULT = 128
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class GenerateEngine:
    """`/generate` over a causal LM. `handle(body)` is the protocol; `produce` the generation
    (subclasses may replace it). Requests are served one at a time (one model), on the model's
    device; sampling draws on the CPU from one seeded generator, so a seed means the same there.

    `scripted_rules`: SCRIPTED answers, `(match, text)` pairs (correct answers) or
    `ScriptedAnswer`s; `scripted_mix` = P switches to the mixed mode (module docstring)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        seed: int = 0,
        model_path: str = "",
        scripted_rules: Sequence[tuple[str, str] | ScriptedAnswer] | None = None,
        scripted_mix: float | None = None,
    ) -> None:
        self.model = model
        self.device = getattr(model, "device", torch.device("cpu"))
        self.scripted_rules = [
            a if isinstance(a, ScriptedAnswer) else ScriptedAnswer(*a) for a in scripted_rules or []
        ]
        self.scripted_mix = scripted_mix
        self._pools = _answer_pools(self.scripted_rules, scripted_mix)
        self._seen: collections.Counter[bytes] = collections.Counter()  # requests per context_key
        self._scripted_meta: dict[str, Any] | None = None  # of the request being answered
        self.seed = seed
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.stop_ids = _stop_ids(tokenizer)
        self.generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.served = 0

    # ------------------------------------------------------------------ protocol

    def handle(self, body: Any) -> dict[str, Any]:
        """Answer one /generate body; ValueError (-> HTTP 400) names what is wrong."""
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        input_ids = self._input_ids(body)
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise ValueError("sampling_params must be an object")
        unknown = sorted(set(params) - _KNOWN_PARAMS)
        if unknown:
            raise ValueError(f"sampling_params: unknown key(s) {unknown}")
        temperature = float(params.get("temperature", 1.0))
        max_new = int(params.get("max_new_tokens", _MAX_NEW_DEFAULT))
        top_p = float(params.get("top_p", 1.0))
        top_k = int(params.get("top_k", -1))
        if temperature <= 0:
            raise ValueError("sampling_params.temperature must be > 0 (greedy decoding is not served)")
        if max_new < 0:
            raise ValueError("sampling_params.max_new_tokens must be >= 0")
        if not 0 < top_p <= 1:
            raise ValueError("sampling_params.top_p must be in (0, 1]")
        stop_ids = set() if params.get("ignore_eos") else set(self.stop_ids)
        stop_ids |= {int(t) for t in params.get("stop_token_ids") or []}
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        if not all(isinstance(s, str) and s for s in stops):
            raise ValueError("sampling_params.stop must be a string or a list of non-empty strings")
        with self._lock:
            self._scripted_meta = None
            ids, logprobs, finish = self.produce(
                input_ids,
                temperature=temperature,
                max_new=max_new,
                stop_ids=stop_ids,
                stops=stops,
                top_p=top_p,
                top_k=top_k,
                body=body,
            )
            self.served += 1
            scripted = self._scripted_meta
        meta: dict[str, Any] = {
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(ids),
        }
        if scripted is not None:
            meta["scripted"] = scripted
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [
                [lp, t, self.tokenizer.decode([t])] for lp, t in zip(logprobs, ids, strict=True)
            ]
        return {"text": self.tokenizer.decode(ids), "meta_info": meta}

    def _input_ids(self, body: dict[str, Any]) -> list[int]:
        if "input_ids" in body:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                raise ValueError("input_ids must be a non-empty list of ints")
            vocab = len(self.tokenizer)
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"input_ids: token id {bad[0]} outside the vocabulary (size {vocab})")
            return [int(t) for t in ids]
        text = body.get("text")
        if isinstance(text, str) and text:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        raise ValueError("input_ids (non-empty list of ints) or text (non-empty string) required")

    # ------------------------------------------------------------------ generation

    def produce(
        self,
        input_ids: list[int],
        *,
        temperature: float,
        max_new: int,
        stop_ids: set[int],
        stops: list[str],
        top_p: float,
        top_k: int,
        body: dict[str, Any],
    ) -> Produced:
        answer = self.scripted_answer(input_ids)
        if answer is not None:
            return self.teacher_forced(input_ids, answer.text, temperature, max_new)
        return self.sample(input_ids, temperature, max_new, stop_ids, stops=stops, top_p=top_p, top_k=top_k)

    def scripted_answer(self, input_ids: list[int]) -> ScriptedAnswer | None:
        """The SCRIPTED answer for this request (None: sample), recorded for its meta_info. In
        mixed mode each call counts as one more request with these ids (the next draw)."""
        if not self._pools:
            return None
        context = self.tokenizer.decode(input_ids)
        pool = next((pool for match, pool in self._pools.items() if match in context), None)
        if pool is None:
            return None
        if self.scripted_mix is None:
            answer = pool[0]
        else:
            key = context_key(self.seed, input_ids)
            occurrence = self._seen[key]
            self._seen[key] += 1
            answer = choose_answer(pool, self.scripted_mix, *mix_draw(key, occurrence))
        self._scripted_meta = {
            "mode": self.scripted_mode,
            "correct": answer.correct,
            "label": answer.label,
            "p": self.scripted_mix,
        }
        return answer

    @property
    def scripted_mode(self) -> str | None:
        """The scripted mode: "scripted", "scripted-mix", or None (the model's answers only)."""
        if not self.scripted_rules:
            return None
        return "scripted" if self.scripted_mix is None else "scripted-mix"

    @torch.no_grad()
    def teacher_forced(self, input_ids: list[int], text: str, temperature: float, max_new: int) -> Produced:
        """`text` + end-of-turn as the answer (cut to max_new), with the model's log-probs of it."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.end_of_turn]
        finish: dict[str, Any] = {"type": "stop", "matched": self.end_of_turn}
        if len(ids) > max_new:
            ids = ids[:max_new]
            finish = {"type": "length", "length": max_new}
        if not ids:
            return [], [], finish
        logits = self.model(input_ids=torch.tensor([input_ids + ids], device=self.device)).logits[0].float()
        lp = torch.log_softmax(
            logits[len(input_ids) - 1 : len(input_ids) - 1 + len(ids)] / temperature, dim=-1
        ).cpu()
        return ids, [float(lp[i, t]) for i, t in enumerate(ids)], finish

    @torch.no_grad()
    def sample(
        self,
        input_ids: list[int],
        temperature: float,
        max_new: int,
        stop_ids: set[int],
        *,
        stops: Iterable[str] = (),
        top_p: float = 1.0,
        top_k: int = -1,
    ) -> Produced:
        stops = list(stops)
        ids: list[int] = []
        logprobs: list[float] = []
        if max_new == 0:
            return ids, logprobs, {"type": "length", "length": 0}
        cache = self._new_cache()
        out = self.model(input_ids=torch.tensor([input_ids], device=self.device), use_cache=True, **cache)
        for _ in range(max_new):
            lp = torch.log_softmax(out.logits[0, -1].float() / temperature, dim=-1).cpu()
            token = int(
                torch.multinomial(_filtered_probs(lp, top_p, top_k), 1, generator=self.generator).item()
            )
            ids.append(token)
            logprobs.append(float(lp[token]))
            if token in stop_ids:
                return ids, logprobs, {"type": "stop", "matched": token}
            if stops:
                text = self.tokenizer.decode(ids)
                hit = next((s for s in stops if text.endswith(s)), None)
                if hit is not None:
                    return ids, logprobs, {"type": "stop", "matched": hit}
            out = self.model(input_ids=torch.tensor([[token]], device=self.device), use_cache=True, **cache)
        return ids, logprobs, {"type": "length", "length": max_new}

    def _new_cache(self) -> dict[str, Any]:
        """An empty KV cache, passed by the name this transformers' forward takes: `cache` from
        transformers 5 (`past_key_values` is deprecated there and goes in 5.40), else
        `past_key_values`. The cache object is filled in place by every call."""
        from transformers import DynamicCache

        params = inspect.signature(self.model.forward).parameters
        return {"cache" if "cache" in params else "past_key_values": DynamicCache()}

    # ------------------------------------------------------------------ server

    def model_info(self) -> dict[str, Any]:
        info = {
            "model_path": self.model_path,
            "is_generation": True,
            "served": self.served,
            "engine": "slime_ext.dev_engine.engine",
            "device": str(self.device),
            "dtype": str(getattr(self.model, "dtype", "")).removeprefix("torch."),
        }
        if self.scripted_mode:
            info["scripted"] = self.scripted_status()
        return info

    def scripted_status(self) -> dict[str, Any]:
        """What /health and /get_model_info say about scripted mode."""
        correct = sum(a.correct for a in self.scripted_rules)
        return {
            "mode": self.scripted_mode,
            "p": self.scripted_mix,
            "seed": self.seed,
            "prompts": len(self._pools),
            "answers": {"correct": correct, "wrong": len(self.scripted_rules) - correct},
        }

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve in a background thread; returns the base URL."""
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return f"http://{host}:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _filtered_probs(logprobs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    probs = logprobs.exp()
    if 0 < top_k < probs.numel():
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, 0) / sorted_p.sum()
        drop = cum - sorted_p / sorted_p.sum() >= top_p  # keep the smallest prefix reaching top_p
        sorted_p[drop] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
    return probs


def _answer_pools(answers: Sequence[ScriptedAnswer], mix: float | None) -> dict[str, list[ScriptedAnswer]]:
    """Answers grouped by `match`, in file order: correct ones only for plain scripted mode; for
    the mix, ValueError if a prompt lacks a kind that P can draw (a correct one if P > 0, a wrong
    one if P < 1)."""
    if mix is not None and not 0.0 <= mix <= 1.0:
        raise ValueError(f"--scripted-mix P must be in [0, 1], got {mix}")
    pools: dict[str, list[ScriptedAnswer]] = {}
    for a in answers:
        if mix is not None or a.correct:
            pools.setdefault(a.match, []).append(a)
    if mix is not None:
        for match, pool in pools.items():
            kinds = {a.correct for a in pool}
            for kind, needed in ((True, mix > 0), (False, mix < 1)):
                if needed and kind not in kinds:
                    raise ValueError(
                        f"--scripted-mix {mix}: no {'correct' if kind else 'wrong'} answer for the "
                        f"prompt matching {match[:60]!r}"
                    )
    return pools


def _stop_ids(tokenizer: Any) -> set[int]:
    ids = set()
    unk = getattr(tokenizer, "unk_token_id", None)
    for tok in _DEFAULT_STOP_TOKENS:
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != unk:
            ids.add(tid)
    if isinstance(getattr(tokenizer, "eos_token_id", None), int):
        ids.add(tokenizer.eos_token_id)
    return ids


def _handler_for(engine: GenerateEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # request lines are noise in the run logs
            pass

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                health: dict[str, Any] = {"status": "ok"}
                if engine.scripted_mode:
                    health["scripted"] = engine.scripted_status()
                self._send(200, health)
            elif self.path == "/get_model_info":
                self._send(200, engine.model_info())
            else:
                self._send(404, {"error": f"not found: GET {self.path}"})

        def do_POST(self) -> None:
            if self.path != "/generate":
                self._send(404, {"error": f"not found: POST {self.path}"})
                return
            try:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                answer = engine.handle(json.loads(raw))
            except ValueError as exc:  # includes JSONDecodeError
                self._send(400, {"error": str(exc)})
                return
            except Exception as exc:  # the engine must answer, not hang the client
                log.exception("generate failed")
                self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
                return
            self._send(200, answer)

        def _send(self, code: int, data: Any) -> None:
            raw = fastjson.dumps_text(data).encode()  # standard JSON: a -inf log-prob is null
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    return Handler


def load_engine(
    model_dir: str,
    *,
    seed: int = 0,
    scripted: str | None = None,
    scripted_mix: float | None = None,
    device: str = "cpu",
    dtype: str = "float32",
) -> GenerateEngine:
    """Load a local HF causal LM directory onto `device` in `dtype` (a `DTYPES` key) into an
    engine; SCRIPTED answers from the file `scripted`, or for the mix without a file the bundled
    sample answers. ValueError for a device that is not there or a bad answers file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    try:
        where = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r}: {exc}") from None
    if where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA device is visible (torch.cuda.is_available() is False)")
    if scripted:
        answers: list[ScriptedAnswer] | None = read_answers(scripted)
    else:
        answers = sample_answers(wrong=True) if scripted_mix is not None else None
    if (why := missing_local_dir(str(model_dir), "--model")) is not None:
        raise ValueError(why)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).to(where).eval()
    return GenerateEngine(
        model,
        tokenizer,
        seed=seed,
        model_path=str(model_dir),
        scripted_rules=answers,
        scripted_mix=scripted_mix,
    )


def main(argv: list[str] | None = None) -> int:
    p = make_parser("slime_ext.dev_engine.engine", __doc__)
    p.add_argument("--model", required=True, help="local Hugging Face model directory")
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    p.add_argument("--port", type=int, default=30000, help="listen port")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (and the seed of --scripted-mix draws)")
    p.add_argument("--device", default="cpu", help="where the model runs: cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="model weights' dtype")
    p.add_argument("--torch-threads", type=int, default=1, help="CPU threads for the model")
    p.add_argument(
        "--scripted", help="SCRIPTED MODE: jsonl of {match, text[, correct, label]} answers (see above)"
    )
    p.add_argument(
        "--scripted-mix",
        type=float,
        metavar="P",
        help="SCRIPTED MIX: a correct answer with probability P, else a wrong one, drawn per request "
        "(answers from --scripted, default the bundled sample problems')",
    )
    p.add_argument("--log-level", default="INFO", help="logging level")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    torch.set_num_threads(max(1, args.torch_threads))
    port_fix = "pass --port N (launcher: ENGINE_PORT)"
    ensure_port_free("tiny_engine", args.host, args.port, port_fix)  # before the model loads
    try:
        engine = load_engine(
            args.model,
            seed=args.seed,
            scripted=args.scripted,
            scripted_mix=args.scripted_mix,
            device=args.device,
            dtype=args.dtype,
        )
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    if engine.scripted_mode == "scripted":
        log.warning(
            "SCRIPTED MODE: %d scripted answer rule(s) from %s", len(engine.scripted_rules), args.scripted
        )
    elif engine.scripted_mode == "scripted-mix":
        status = engine.scripted_status()
        log.warning(
            "SCRIPTED MODE (mix): answers are scripted, not the model's: correct with probability %s, "
            "else wrong (seed %d; %d prompt(s), %d correct / %d wrong answers from %s)",
            args.scripted_mix,
            args.seed,
            status["prompts"],
            status["answers"]["correct"],
            status["answers"]["wrong"],
            args.scripted or "the bundled sample problems",
        )
    stopped = threading.Event()
    # Ctrl-C, SIGTERM and SIGHUP (tmux closing the pane, a dropped SSH session) all end the
    # engine the same way: stop serving, log, exit 0.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        url = engine.start(args.host, args.port)
    except OSError as exc:
        if is_address_in_use(exc):
            exit_port_in_use("tiny_engine", args.host, args.port, port_fix)
        raise
    log.info(
        "tiny_engine serving %s on %s (/generate, /health; %s, %s)",
        args.model,
        url,
        engine.device,
        args.dtype,
    )
    stopped.wait()
    log.info("shutting down after %d requests", engine.served)
    engine.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
