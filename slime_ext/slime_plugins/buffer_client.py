"""Synchronous client of the rollout buffer server's trainer-side API (docs/BUFFER_SERVER.md).

The rollout function is synchronous (slime calls it from the RolloutManager actor, outside the
rollout asyncio loop), so plain blocking httpx is right here. Every non-2xx answer raises
BufferError carrying the server's `{"error": ...}` text and the HTTP status.
"""

from __future__ import annotations

from typing import Any

import httpx

from krl_common import fastjson
from slime_ext.trajectory.codec import PACKED_BATCH_MEDIA_TYPE, unpack_batch

__all__ = ["BufferClient", "BufferError"]


class BufferError(RuntimeError):
    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class BufferClient:
    def __init__(
        self, url: str, *, timeout_s: float = 120.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), transport=transport)

    def close(self) -> None:
        self._http.close()

    def _send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        wait_s: float = 0.0,
        accept: str = "application/json",
    ) -> httpx.Response:
        """The server's 2xx answer; BufferError with its `{"error": ...}` text otherwise."""
        url = f"{self.url}{path}"
        try:
            response = self._http.request(
                method,
                url,
                content=None if body is None else fastjson.dumps(body),
                headers={"Content-Type": "application/json", "Accept": accept},
                timeout=httpx.Timeout(self._timeout_s + wait_s, connect=10.0),
            )
        except httpx.TransportError as exc:
            raise BufferError(
                f"{method} {url}: buffer server unreachable ({type(exc).__name__}: {exc})"
            ) from exc
        if response.status_code >= 300:
            try:
                data = fastjson.loads(response.content)
            except ValueError:
                data = None
            message = data.get("error") if isinstance(data, dict) else None
            raise BufferError(
                f"{method} {url}: HTTP {response.status_code}: {message or response.text[:500]}",
                response.status_code,
            )
        return response

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, wait_s: float = 0.0
    ) -> Any:
        response = self._send(method, path, body, wait_s=wait_s)
        try:
            return fastjson.loads(response.content) if response.content else {}
        except ValueError as exc:
            raise BufferError(
                f"{method} {self.url}{path}: the answer is not JSON ({exc}): {response.text[:200]}"
            ) from None

    def start_runner(self) -> dict[str, Any]:
        return self._request("POST", "/rollout/start", {})

    def stop_runner(self, *, wait_s: float = 780.0) -> dict[str, Any]:
        """`POST /rollout/stop`: answers once the runner's episodes in flight have ended or were
        abandoned, hence the longer wait."""
        return self._request("POST", "/rollout/stop", {}, wait_s=wait_s)

    def set_policy_version(self, version: int) -> dict[str, Any]:
        return self._request("POST", "/policy_version", {"version": version})

    def lease(self, num_groups: int, *, timeout_s: float, lease_s: float | None = None) -> dict[str, Any]:
        """Lease whole groups as packed records: the reply's JSON shape ({"lease_id", "groups":
        [{"instance_id", "records"}], "meta"}) with each record as its packed body, which
        `trajectory_codec.decode` turns into a TrajectoryRecord (done by the caller, which can
        release the lease if a record does not decode)."""
        body: dict[str, Any] = {"num_groups": num_groups, "timeout_s": timeout_s}
        if lease_s is not None:
            body["lease_s"] = lease_s
        response = self._send("POST", "/batches", body, wait_s=timeout_s, accept=PACKED_BATCH_MEDIA_TYPE)
        if response.headers.get("content-type", "").split(";")[0].strip() != PACKED_BATCH_MEDIA_TYPE:
            raise BufferError(
                f"POST {self.url}/batches: expected a {PACKED_BATCH_MEDIA_TYPE} reply, got "
                f"{response.headers.get('content-type')!r} (a buffer server of another version?)"
            )
        try:
            header, groups = unpack_batch(response.content)
        except ValueError as exc:
            raise BufferError(f"POST {self.url}/batches: {exc}") from None
        for described, bodies in zip(header["groups"], groups, strict=True):
            described["records"] = bodies
        return header

    def ack(self, lease_id: str) -> dict[str, Any]:
        return self._request("POST", "/batches/ack", {"lease_id": lease_id})

    def release(self, lease_id: str) -> dict[str, Any]:
        return self._request("POST", "/batches/release", {"lease_id": lease_id})

    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/stats")
