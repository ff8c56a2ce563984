"""Synchronous client of the rollout buffer server's trainer-side API (docs/BUFFER_SERVER.md).

The rollout function is synchronous (slime calls it from the RolloutManager actor, outside the
rollout asyncio loop), so plain blocking httpx is right here. Every non-2xx answer raises
BufferError carrying the server's `{"error": ...}` text and the HTTP status.
"""

from __future__ import annotations

from typing import Any

import httpx

from slime_ext import fastjson

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

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, wait_s: float = 0.0
    ) -> Any:
        url = f"{self.url}{path}"
        try:
            response = self._http.request(
                method,
                url,
                content=None if body is None else fastjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout=httpx.Timeout(self._timeout_s + wait_s, connect=10.0),
            )
        except httpx.TransportError as exc:
            raise BufferError(
                f"{method} {url}: buffer server unreachable ({type(exc).__name__}: {exc})"
            ) from exc
        try:
            data = fastjson.loads(response.content) if response.content else {}
        except ValueError:
            data = {"error": response.text[:500]}
        if response.status_code >= 300:
            message = data.get("error") if isinstance(data, dict) else None
            raise BufferError(
                f"{method} {url}: HTTP {response.status_code}: {message or response.text[:500]}",
                response.status_code,
            )
        return data

    def start_runner(self) -> dict[str, Any]:
        return self._request("POST", "/rollout/start", {})

    def set_policy_version(self, version: int) -> dict[str, Any]:
        return self._request("POST", "/policy_version", {"version": version})

    def lease(self, num_groups: int, *, timeout_s: float, lease_s: float | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"num_groups": num_groups, "timeout_s": timeout_s}
        if lease_s is not None:
            body["lease_s"] = lease_s
        return self._request("POST", "/batches", body, wait_s=timeout_s)

    def ack(self, lease_id: str) -> dict[str, Any]:
        return self._request("POST", "/batches/ack", {"lease_id": lease_id})

    def release(self, lease_id: str) -> dict[str, Any]:
        return self._request("POST", "/batches/release", {"lease_id": lease_id})

    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/stats")
