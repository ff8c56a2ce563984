"""A small generation engine that speaks SGLang's native `/generate` protocol, for CPU runs.

Not SGLang: it serves any local Hugging Face causal LM (e.g. the tiny model of
`slime_ext/tiny_model.py`) one request at a time on the CPU, so the CPU dry run
(`python -m tools.dry_run`) exercises the real token-in/token-out path of the agent runner
without a GPU. Any server of the same protocol (a real SGLang router) can replace it.

Protocol (`slime_interfaces.md` section 3):
- `POST /generate` `{"input_ids": [...] | "text": str, "sampling_params": {...},
  "return_logprob": bool}` ->
  `{"text", "meta_info": {"output_token_logprobs": [[logprob, token_id, token_text], ...],
  "finish_reason": {"type": "stop", "matched": id|str} | {"type": "length", "length": n} |
  {"type": "abort", "message": ...}, "prompt_tokens", "completion_tokens"}}`.
  `output_token_logprobs` is present only with `return_logprob`.
- `GET /health`, `GET /health_generate`: 200 once the model is loaded. `GET /get_model_info`.

Sampling: token by token with `torch.multinomial` over `softmax(logits / temperature)`, restricted
by `top_k` / `top_p` when set; the returned log-prob of a token is `log_softmax(logits /
temperature)` at that token (what slime's trainer recomputes). Generation stops after a stop token
(the tokenizer's EOS, `<|im_end|>` / `<|endoftext|>` when present, plus `stop_token_ids`), which
is included in the output as SGLang does with `no_stop_trim`; after the decoded output ends with
one of the `stop` strings; or after `max_new_tokens` (finish `length`).
Sampling params that change nothing here (`no_stop_trim`, `skip_special_tokens`, ...) are
accepted; unknown ones are rejected with 400 naming the key, as SGLang's SamplingParams does.

SCRIPTED MODE (labelled; not a model's answers): with `--scripted FILE` (jsonl of
`{"match": str, "text": str}`), a request whose decoded context contains a rule's `match` is
answered with that rule's `text` followed by the end-of-turn token, cut to `max_new_tokens`
(finish `length`) and with each token's teacher-forced log-prob under the same temperature, so
the log-prob contract still holds; other requests are sampled. The dry run's `--scripted` uses it
to send known candidates through the eval server deterministically.

CLI: `python -m slime_ext.tiny_engine --model DIR [--host 127.0.0.1] [--port 30000] [--scripted FILE]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

__all__ = ["GenerateEngine", "Produced", "load_engine", "main"]

log = logging.getLogger("slime_ext.tiny_engine")

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


class GenerateEngine:
    """`/generate` over a causal LM. `handle(body)` is the protocol; `produce` the generation
    (subclasses may replace it). Requests are served one at a time (one CPU model)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        seed: int = 0,
        model_path: str = "",
        scripted_rules: list[tuple[str, str]] | None = None,
    ) -> None:
        self.model = model
        self.scripted_rules = list(scripted_rules or [])
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
        meta: dict[str, Any] = {
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(ids),
        }
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
        if self.scripted_rules:
            context = self.tokenizer.decode(input_ids)
            for match, text in self.scripted_rules:
                if match in context:
                    return self.teacher_forced(input_ids, text, temperature, max_new)
        return self.sample(input_ids, temperature, max_new, stop_ids, stops=stops, top_p=top_p, top_k=top_k)

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
        logits = self.model(input_ids=torch.tensor([input_ids + ids])).logits[0].float()
        lp = torch.log_softmax(
            logits[len(input_ids) - 1 : len(input_ids) - 1 + len(ids)] / temperature, dim=-1
        )
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
        out = self.model(input_ids=torch.tensor([input_ids]), use_cache=True)
        for _ in range(max_new):
            lp = torch.log_softmax(out.logits[0, -1].float() / temperature, dim=-1)
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
            out = self.model(
                input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True
            )
        return ids, logprobs, {"type": "length", "length": max_new}

    # ------------------------------------------------------------------ server

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "is_generation": True,
            "served": self.served,
            "engine": "slime_ext.tiny_engine",
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
                self._send(200, {"status": "ok"})
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
            raw = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    return Handler


def load_scripted_rules(path: str) -> list[tuple[str, str]]:
    """The rules of a scripted-mode jsonl file; ValueError naming the line of a bad one."""
    rules = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                match, text = row["match"], row["text"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: expected {{'match': str, 'text': str}} ({exc})") from None
            if not (isinstance(match, str) and match and isinstance(text, str)):
                raise ValueError(f"{path}:{lineno}: match must be a non-empty string and text a string")
            rules.append((match, text))
    return rules


def load_engine(model_dir: str, *, seed: int = 0, scripted: str | None = None) -> GenerateEngine:
    """Load a local HF causal LM directory (float32, CPU) into an engine."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rules = load_scripted_rules(scripted) if scripted else None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return GenerateEngine(model, tokenizer, seed=seed, model_path=str(model_dir), scripted_rules=rules)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m slime_ext.tiny_engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="local Hugging Face model directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--torch-threads", type=int, default=1, help="CPU threads for the model")
    p.add_argument("--scripted", help="SCRIPTED MODE: jsonl of {match, text} answers (see above)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    torch.set_num_threads(max(1, args.torch_threads))
    try:
        engine = load_engine(args.model, seed=args.seed, scripted=args.scripted)
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    if engine.scripted_rules:
        log.warning(
            "SCRIPTED MODE: %d scripted answer rule(s) from %s", len(engine.scripted_rules), args.scripted
        )
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    url = engine.start(args.host, args.port)
    log.info("tiny_engine serving %s on %s (/generate, /health)", args.model, url)
    stopped.wait()
    log.info("shutting down after %d requests", engine.served)
    engine.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
