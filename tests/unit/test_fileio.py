"""Local model paths that do not exist are named as such (krl_common/fileio.py), by the engine
and the runner, instead of a Hub error about repository ids."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_a_missing_local_model_path_is_named_as_such(tmp_path) -> None:
    from krl_common.fileio import missing_local_dir

    assert missing_local_dir(str(tmp_path), "--model") is None
    assert missing_local_dir("Qwen/Qwen3-8B", "--model") is None  # a Hub id: the loader's business
    assert (
        missing_local_dir(str(tmp_path / "nope"), "--model") == f"--model: {tmp_path / 'nope'} does not exist"
    )
    (tmp_path / "f").write_text("x")
    assert "is a file" in missing_local_dir(str(tmp_path / "f"), "runner.tokenizer")


def test_the_engine_and_the_runner_say_a_local_directory_does_not_exist(tmp_path) -> None:
    from buffer_server.runner.agent_runner import RunnerError, load_tokenizer
    from slime_ext.dev_engine.engine import load_engine

    with pytest.raises(ValueError, match="does not exist"):
        load_engine(str(tmp_path / "model"))
    with pytest.raises(RunnerError, match=r"runner.tokenizer: .*tok does not exist"):
        load_tokenizer(str(tmp_path / "tok"))
