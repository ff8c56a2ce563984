"""krl_common/urls.py: the one reader of server URL lists, and its use for a settings field."""

from __future__ import annotations

import pytest

from krl_common.urls import parse_urls, url_list_setting
from krl_common.validation import ValidationError

pytestmark = pytest.mark.unit


def test_allow_empty() -> None:
    with pytest.raises(ValueError, match="no eval server URL given"):
        parse_urls(" , ")
    assert parse_urls(" , ", allow_empty=True) == [] and parse_urls([], allow_empty=True) == []


def test_url_list_setting_reads_strings_and_lists_and_names_the_key() -> None:
    assert url_list_setting("a:1, b:2/", "k.eval_urls") == ("http://a:1", "http://b:2")
    assert url_list_setting(["a:1", "http://a:1"], "k.eval_urls") == ("http://a:1",)
    assert url_list_setting("", "k.eval_urls", allow_empty=True) == ()
    with pytest.raises(ValidationError, match=r"^k\.eval_urls: no eval server URL given"):
        url_list_setting("", "k.eval_urls")
    with pytest.raises(ValidationError, match=r"^k\.eval_urls: eval server URL 'ftp://x': scheme"):
        url_list_setting(["ftp://x"], "k.eval_urls")
    with pytest.raises(ValidationError, match=r"^k\.eval_urls: eval server URL must be a string, got int"):
        url_list_setting(["a:1", 2], "k.eval_urls")
    assert url_list_setting(5, "k.eval_urls") == 5  # left to the typed settings check to name
