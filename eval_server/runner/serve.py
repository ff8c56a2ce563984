"""The runner's side of the judge protocol: turn the inputs the judge gives into outputs.

Operations (frames of eval_server.wire, one reply each unless said otherwise):
  {"request": <EvalRequest json>, "memory_share": f}  the first frame, no reply
  {"op": "reference"}        import the problem and build `Model` (before any candidate code);
                             with "compile": true, through torch.compile, compiled on one call
  {"op": "candidate"}        run the first layer of checks on the candidate (the `first_layer`
                             callable: static rules, build, load, correctness trials) and reply
                             {"report": <EvalResult json>}; its model serves the next calls
  {"op": "bind", ...}        GPU: map the judge's input buffers and its go/done words (also
                             before any model: the judge measures the hand-over with empty windows)
  {"op": "run", ...}         GPU: for each window w, queue [wait go >= c+w+1 (a stream memory
                             wait), the calls, write
                             done = c+w+1] on this process's default stream, then reply
                             {"window": w, "outputs": [...]} with where each call's outputs live
                             (IPC handle + offset), so the judge can snapshot them after "done"
  {"op": "call", ...}        CPU: inputs as bytes in, outputs as bytes out
  {"op": "exit"}

Nothing here decides anything: a reply the judge cannot use is the candidate's failure.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch

from eval_server import gpu_ipc, wire
from eval_server.checks.compare import flatten_output
from eval_server.pipeline import loader

# given the request and the memory share the judge named (None: the worker's): runs the first
# layer, returns (report json, the candidate's model or None)
# (request, memory share, the judge's facts of the reference) -> (report, the candidate's model)
FirstLayer = Callable[[dict[str, Any], float | None, dict[str, Any] | None], tuple[dict[str, Any], Any]]


# where torch.compile of the reference keeps its artefacts (Inductor's code and Triton's kernels)
_COMPILE_CACHES = (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"))


def _traceback(exc: BaseException, workdir: str) -> str:
    return loader.format_exception_tail(exc, workdir)


class Runner:
    def __init__(self, sock: socket.socket, device: torch.device, workdir: str) -> None:
        self.sock = sock
        self.device = device
        self.workdir = workdir
        self.model: Any = None
        self.slots: list[list[Any]] = []
        self.sync_ptr = 0
        self.stream: torch.cuda.Stream | None = None
        self._keep: list[Any] = []
        self._imported: list[tuple[int, int]] = []  # (start, end) of the judge's mapped input buffers

    # ----------------------------------------------------------------- models
    def load_reference(self, source: str, seed: int, compiled: bool = False) -> None:
        """The reference as the judge times it; `compiled`: through torch.compile (default mode),
        compiled here on one call so that no timing holds the compile, with Inductor's and
        Triton's caches in this evaluation's own directory (nothing an earlier candidate of this
        worker could write takes part; the candidate's own kernels use the worker's cache again)."""
        module = loader.import_source(source, self.workdir, "reference_runner")
        init = loader.make_init_inputs(module, seed, self.device)
        model = loader.build_model(module.Model, init, seed, self.device)
        if compiled:
            saved = {var: os.environ.get(var) for var, _ in _COMPILE_CACHES}
            for var, sub in _COMPILE_CACHES:
                os.environ[var] = os.path.join(self.workdir, "compiled_reference", sub)
            try:
                model = torch.compile(model)
                with torch.no_grad():
                    model(*loader.make_inputs(module, seed, self.device))
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            finally:
                for var, value in saved.items():
                    if value is None:
                        os.environ.pop(var, None)
                    else:
                        os.environ[var] = value
        self.model = model

    # ----------------------------------------------------------------- GPU
    def bind(self, msg: dict[str, Any]) -> None:
        gpu_ipc.ensure_context(self.device)
        # the legacy default stream, not a stream of its own: a CUDA extension's `<<<grid, block>>>`
        # without a stream argument launches there, and torch's streams do not wait for it, so
        # the wait for "go" on any other stream let honest CUDA kernels read the previous
        # window's inputs (every honest CUDA candidate was `incorrect`)
        self.stream = torch.cuda.default_stream(self.device)
        self.sync_ptr = gpu_ipc.open_handle(bytes.fromhex(msg["sync"]))
        self.slots = []
        for slot in msg["slots"]:
            args: list[Any] = []
            for desc in slot:
                if "value" in desc:
                    args.append(desc["value"])
                    continue
                dtype, shape, nbytes = wire.parse_meta(desc, 1 << 62)
                ptr = gpu_ipc.open_handle(bytes.fromhex(desc["handle"]))
                self._imported.append((ptr, ptr + nbytes))
                args.append(gpu_ipc.tensor_at(ptr, nbytes, dtype, shape, self.device))
            self.slots.append(args)
        self.warm()

    def warm(self) -> None:
        """One call per slot before any window, outside the protocol: the first launch of a kernel
        loads its module (CUDA's lazy loading synchronizes the context) and the first outputs are
        cudaMalloc'ed; either would block this host while its stream waits for "go"."""
        if self.stream is None or self.model is None:
            return
        with torch.cuda.stream(self.stream), torch.no_grad():
            for args in self.slots:
                self._leaves(self.model(*args))
        torch.cuda.synchronize(self.device)

    def _leaves(self, out: Any) -> list[tuple[str, Any]]:
        """The output's leaves as tensors of this process's own memory, copied when not contiguous
        or when they alias a judge buffer (an input returned as it is: an imported allocation
        cannot be exported back); the copies are queued before "done", inside the window."""
        leaves = []
        for path, leaf in flatten_output(out):
            if isinstance(leaf, torch.Tensor) and leaf.device.type == "cuda":
                ptr = leaf.data_ptr()
                if any(lo <= ptr < hi for lo, hi in self._imported):
                    leaf = leaf.clone(memory_format=torch.contiguous_format)
                leaf = leaf.contiguous()
            leaves.append((path, leaf))
        return leaves

    def _describe(self, leaves: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        descs = []
        for path, leaf in leaves:
            if not isinstance(leaf, torch.Tensor) or leaf.device.type != "cuda":
                descs.append({"path": path, "kind": type(leaf).__name__})
                continue
            self._keep.append(leaf)
            ptr = leaf.data_ptr()
            base = gpu_ipc.address_range(ptr)[0] if leaf.numel() else ptr
            # exported again for every output: an address says nothing of which allocation is
            # there now (the caching allocator frees segments and the next cudaMalloc may get
            # the same base), and a handle remembered by address would name a freed one
            handle = gpu_ipc.export(base).hex() if leaf.numel() else ""
            descs.append({"path": path, "handle": handle, "offset": ptr - base, **wire.tensor_meta(leaf)})
        return descs

    def run(self, msg: dict[str, Any]) -> None:
        assert self.stream is not None, "bind before run"
        windows, calls, counter = int(msg["windows"]), list(msg["calls"]), int(msg["counter"])
        go, done = self.sync_ptr, self.sync_ptr + 4
        with torch.cuda.stream(self.stream), torch.no_grad():
            for w in range(windows):
                value = counter + w + 1
                self._keep = []  # the previous window's outputs: its snapshot precedes this go
                gpu_ipc.wait_value(self.stream, go, value)
                try:
                    outs = [self._leaves(self.model(*self.slots[s])) for s in calls]
                    gpu_ipc.write_value(self.stream, done, value)
                    reply: dict[str, Any] = {"window": w, "outputs": [self._describe(o) for o in outs]}
                except Exception as exc:  # noqa: BLE001 - the candidate's failure, reported
                    wire.send(self.sock, {"window": w, "error": _traceback(exc, self.workdir)})
                    return
                wire.send(self.sock, reply)

    # ----------------------------------------------------------------- CPU
    def call(self, msg: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        args, at = [], 0
        for desc in msg["args"]:
            if "value" in desc:
                args.append(desc["value"])
                continue
            dtype, shape, nbytes = wire.parse_meta(desc, len(payload))
            args.append(wire.tensor_from(payload[at : at + nbytes], dtype, shape))
            at += nbytes
        with torch.no_grad():
            out = self.model(*args)
        descs, chunks = [], []
        for path, leaf in flatten_output(out):
            if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu":
                descs.append({"path": path, **wire.tensor_meta(leaf)})
                chunks.append(bytes(wire.tensor_bytes(leaf)))
            else:
                descs.append({"path": path, "kind": type(leaf).__name__})
        return {"outputs": descs}, b"".join(chunks)


def serve(sock: socket.socket, device: torch.device, workdir: str, first_layer: FirstLayer) -> None:
    """Answer the judge until it says exit or goes away; its first frame carries the request."""
    runner = Runner(sock, device, workdir)
    try:
        first, _ = wire.recv(sock, max_payload=0)
    except wire.WireError:
        return
    request = first.get("request") or {}
    share = first.get("memory_share")
    share = float(share) if isinstance(share, (int, float)) and 0 < share <= 1 else None
    while True:
        try:
            msg, payload = wire.recv(sock, max_payload=1 << 40)
        except wire.WireError:
            return
        op = msg.get("op")
        try:
            if op == "exit":
                return
            if op == "reference":
                runner.load_reference(
                    request["reference"], request["options"]["seed"], bool(msg.get("compile"))
                )
                wire.send(sock, {"ok": True})
            elif op == "candidate":
                facts = msg.get("facts")
                report, model = first_layer(request, share, facts if isinstance(facts, dict) else None)
                runner.model = model
                if model is not None:
                    try:
                        runner.warm()
                    except Exception:  # noqa: BLE001 - its calls in the judge's windows will say
                        pass
                wire.send(sock, {"report": report})
            elif runner.model is None and (op == "call" or (op == "run" and msg.get("calls"))):
                wire.send(sock, {"error": "the candidate's ModelNew was never built in this process"})
            elif op == "bind":
                runner.bind(msg)
                wire.send(sock, {"ok": True})
            elif op == "run":
                runner.run(msg)
            elif op == "call":
                header, out = runner.call(msg, payload)
                wire.send(sock, header, out)
            else:
                wire.send(sock, {"error": f"unknown op {op!r}"})
        except Exception as exc:  # noqa: BLE001 - reported; the judge decides what it means
            wire.send(sock, {"error": _traceback(exc, workdir)})
