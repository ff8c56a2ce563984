"""TEST DOUBLE of SGLang's native `/generate` endpoint (not SGLang; for tests only).

It follows the request/response format documented in `/work/shared/slime_interfaces.md` section 3:
request `{"input_ids": [...], "sampling_params": {"temperature", "max_new_tokens",
"stop_token_ids"?, ...}, "return_logprob": true}`; response `{"text", "meta_info":
{"output_token_logprobs": [[logprob, token_id, token_text], ...], "finish_reason": {"type":
"stop", "matched": id} | {"type": "length", "length": n} | {"type": "abort", "message": ...},
"prompt_tokens", "completion_tokens"}}`.

Sampling: a (tiny) causal LM samples token by token with `torch.multinomial` over
`softmax(logits / temperature)`; the returned log-prob of each token is `log_softmax(logits /
temperature)` at that token (what training recomputes). Generation stops after a stop token
(`<|im_end|>` or `<|endoftext|>` by default, plus `stop_token_ids`), which is included in the
output as SGLang does with `no_stop_trim`, or after `max_new_tokens` (finish `length`).

SCRIPTED MODE (labelled as such): texts queued in `double.scripted` are answered in order instead
of sampling: the text is tokenized, `<|im_end|>` appended, cut to `max_new_tokens`, and each
token's log-prob is the model's teacher-forced log-prob under the same temperature, so scripted
turns obey the same log-prob contract. `double.abort_next = True` makes the next request finish
with `abort`. Every request body is kept in `double.requests`, every answer's ids in `double.outputs`.
"""

from __future__ import annotations

import collections
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

__all__ = ["SGLangDouble"]


class SGLangDouble:
    def __init__(self, model: Any, tokenizer: Any, *, seed: int = 0) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = {
            tokenizer.convert_tokens_to_ids("<|im_end|>"),
            tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        }
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.generator = torch.Generator().manual_seed(seed)
        self.scripted: collections.deque[str] = collections.deque()
        self.abort_next = False
        self.requests: list[dict[str, Any]] = []
        self.outputs: list[list[int]] = []  # token ids answered, per request
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ server

    def start(self) -> str:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                if self.path != "/generate":
                    self._send(404, {"error": "not found"})
                    return
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    answer = double.handle(body)
                except ValueError as exc:
                    self._send(400, {"error": str(exc)})
                    return
                self._send(200, answer)

            def _send(self, code: int, data: Any) -> None:
                raw = json.dumps(data).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # ------------------------------------------------------------------ /generate

    def handle(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("input_ids"), list) or not body["input_ids"]:
            raise ValueError("input_ids (non-empty list of ints) required")
        params = body.get("sampling_params") or {}
        temperature = float(params.get("temperature", 1.0))
        max_new = int(params.get("max_new_tokens", 128))
        if temperature <= 0 or max_new < 0:
            raise ValueError("bad sampling params")
        stop_ids = self.stop_ids | set(params.get("stop_token_ids") or [])
        input_ids = [int(t) for t in body["input_ids"]]
        with self._lock:
            self.requests.append(body)
            if self.abort_next:
                self.abort_next = False
                ids, logprobs, finish = [], [], {"type": "abort", "message": "aborted by test"}
            elif self.scripted:
                ids, logprobs, finish = self._scripted(
                    input_ids, self.scripted.popleft(), temperature, max_new
                )
            else:
                ids, logprobs, finish = self._sample(input_ids, temperature, max_new, stop_ids)
            self.outputs.append(list(ids))
        entries = [[lp, t, self.tokenizer.decode([t])] for lp, t in zip(logprobs, ids, strict=True)]
        meta = {
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(ids),
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = entries
        return {"text": self.tokenizer.decode(ids), "meta_info": meta}

    @torch.no_grad()
    def _sample(self, input_ids: list[int], temperature: float, max_new: int, stop_ids: set[int]):
        ids: list[int] = []
        logprobs: list[float] = []
        out = self.model(input_ids=torch.tensor([input_ids]), use_cache=True)
        for _ in range(max_new):
            lp = torch.log_softmax(out.logits[0, -1].float() / temperature, dim=-1)
            token = int(torch.multinomial(lp.exp(), 1, generator=self.generator).item())
            ids.append(token)
            logprobs.append(float(lp[token]))
            if token in stop_ids:
                return ids, logprobs, {"type": "stop", "matched": token}
            out = self.model(
                input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True
            )
        return ids, logprobs, {"type": "length", "length": max_new}

    @torch.no_grad()
    def _scripted(self, input_ids: list[int], text: str, temperature: float, max_new: int):
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.im_end]
        finish: dict[str, Any] = {"type": "stop", "matched": self.im_end}
        if len(ids) > max_new:
            ids = ids[:max_new]
            finish = {"type": "length", "length": max_new}
        if not ids:
            return [], [], finish
        logits = self.model(input_ids=torch.tensor([input_ids + ids])).logits[0].float()
        lp = torch.log_softmax(
            logits[len(input_ids) - 1 : len(input_ids) - 1 + len(ids)] / temperature, dim=-1
        )
        logprobs = [float(lp[i, t]) for i, t in enumerate(ids)]
        return ids, logprobs, finish
