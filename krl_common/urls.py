"""Server URL lists as users give them (a comma-separated flag or env var, or a YAML list)."""

from __future__ import annotations

from collections.abc import Sequence


def parse_urls(urls: str | Sequence[str], what: str = "eval server URL") -> list[str]:
    """Normalise a comma-separated string (env var, CLI flag) or a list of server URLs.

    Whitespace and trailing slashes are stripped, `host:port` gets `http://`, duplicates are
    dropped (keeping the first), and an empty result is a ValueError.
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
    if not result:
        raise ValueError(f"no {what} given (got {urls!r})")
    return result
