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


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_says_why_and_a_listening_port_is_reachable() -> None:
    import socket

    from krl_common.urls import unreachable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert unreachable(f"http://127.0.0.1:{s.getsockname()[1]}/v1") is None
    port = _closed_port()
    why = unreachable(f"127.0.0.1:{port}")
    assert why is not None and f"127.0.0.1:{port}" in why
    assert unreachable("http://:80") == "no host in the URL"


def test_tools_name_the_flag_and_url_in_one_line(tmp_path, capsys) -> None:
    from tools import eval_model, eval_samples

    url = f"http://127.0.0.1:{_closed_port()}"
    assert eval_samples.main(["--url", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --url {url}: nothing answers"), err
    from slime_ext.rollout.problems import PromptRecord, write_prompt_records

    prompts = tmp_path / "p.jsonl"  # valid local inputs: the URL is what is wrong
    write_prompt_records(
        prompts, [PromptRecord("kb_L1_relu", 1, "relu", "relu", "class Model: pass\n", split="holdout")]
    )
    argv = ["--out", str(tmp_path / "out"), "--prompts", str(prompts), "--model", "m"]
    assert eval_model.main([*argv, "--url", url + "/v1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --url {url}/v1: nothing answers"), err
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
