"""Server URL lists as users give them (a comma-separated flag or env var, or a YAML list).

`parse_urls` is the one reader of such lists; `url_list_setting` applies it to a settings field
(the runner's and the plug-ins' `eval_urls`) so its errors name the recipe key.
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Sequence
from typing import Any

from krl_common.validation import ValidationError

__all__ = ["parse_urls", "unreachable", "url_list_setting"]


def parse_urls(
    urls: str | Sequence[str], what: str = "eval server URL", *, allow_empty: bool = False
) -> list[str]:
    """Normalise a comma-separated string (env var, CLI flag) or a list of server URLs.

    Whitespace and trailing slashes are stripped, `host:port` gets `http://`, duplicates are
    dropped (keeping the first), and an empty result is a ValueError unless `allow_empty`.
    """
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    result: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{what} must be a string, got {type(item).__name__}")
        url = item.strip().rstrip("/")
        if not url:
            continue
        if "://" not in url:
            url = "http://" + url
        scheme = url.split("://", 1)[0].lower()
        if scheme not in ("http", "https"):
            raise ValueError(f"{what} {url!r}: scheme must be http or https")
        if url not in result:
            result.append(url)
    if not result and not allow_empty:
        raise ValueError(f"no {what} given (got {urls!r})")
    return result


def url_list_setting(value: Any, path: str, *, allow_empty: bool = False) -> Any:
    """A settings field's URL list as written (comma-separated string, or list) -> a tuple of
    normalised URLs; a bad URL is a ValidationError naming `path`. A value of any other type is
    returned unchanged, for the typed settings check (krl_common/settings.py) to name its type."""
    if not isinstance(value, (str, list, tuple)):
        return value
    try:
        return tuple(parse_urls(value, allow_empty=allow_empty))
    except ValueError as exc:
        raise ValidationError(f"{path}: {exc}") from None


def unreachable(url: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing accepts a connection at `url`'s host and port (None: something does), so a tool
    can say so in one line before it starts anything that would wait on it."""
    parts = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"not a valid URL ({exc})"
    if not parts.hostname:
        return "no host in the URL"
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"nothing answers at {parts.hostname}:{port} ({exc.strerror or type(exc).__name__})"
