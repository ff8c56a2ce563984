"""Recipe YAML (slime_ext/rollout/recipe.py): episode section parsing and error messages."""

from __future__ import annotations

import pytest

from krl_common.validation import ValidationError
from slime_ext.rollout.prompts import default_prompt
from slime_ext.rollout.recipe import episode_config_from_dict, load_recipe, recipe_section

pytestmark = pytest.mark.unit


def test_defaults_and_nested_sections(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        "rollout_temperature: 1.0\n"
        "kernel_rl:\n"
        "  episode:\n"
        "    max_turns: 4\n"
        "    reward: {gamma: 0.5, credit: per_turn, compiled_statuses: [incorrect]}\n"
        "    prompt: {one_shot: true}\n"
        "    eval_options: {timing_trials: 50, tolerance: strict}\n"
        "  runner: {concurrency: 8}\n"
    )
    recipe = load_recipe(path)
    cfg = episode_config_from_dict(recipe_section(recipe, "episode"))
    assert cfg.max_turns == 4
    assert cfg.reward.gamma == 0.5 and cfg.reward.credit == "per_turn"
    assert cfg.reward.compiled_statuses == ("incorrect",)
    assert cfg.prompt.one_shot is True
    assert cfg.eval_options.timing_trials == 50 and cfg.eval_options.tolerance == "strict"
    assert recipe_section(recipe, "runner") == {"concurrency": 8}
    assert recipe_section(recipe, "absent") == {}
    assert episode_config_from_dict(None) == episode_config_from_dict({})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"max_turn": 3}, r"kernel_rl\.episode: unknown field"),
        ({"reward": {"gama": 0.4}}, r"kernel_rl\.episode\.reward: unknown field"),
        ({"reward": {"credit": "both"}}, r"kernel_rl\.episode\.reward: credit must be"),
        ({"max_turns": 0}, "max_turns must be >= 1"),
        ({"eval_options": {"timing_trials": 1}}, "timing_trials"),
        (
            {"backend": "cuda-c"},
            r"kernel_rl\.episode\.backend: unknown kernel backend 'cuda-c'; choose one of triton, cuda",
        ),
        (
            {"backend": "cuda", "eval_options": {"backend": "cuda"}},
            r"eval_options\.backend: set kernel_rl\.episode\.backend",
        ),
    ],
)
def test_errors_name_the_key(data, message):
    with pytest.raises(ValidationError, match=message):
        episode_config_from_dict(data)


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("episode: {}\n")
    with pytest.raises(ValidationError, match="top-level 'kernel_rl'"):
        load_recipe(bad)


def test_backend_picks_the_prompt_wording_and_the_prompt_section_edits_it():
    triton = episode_config_from_dict({})
    assert triton.backend == "triton" and triton.prompt == default_prompt("triton")
    cuda = episode_config_from_dict({"backend": "cuda"})
    assert cuda.backend == "cuda" and cuda.prompt == default_prompt("cuda")
    edited = episode_config_from_dict({"backend": "cuda", "prompt": {"one_shot": True, "system": None}})
    assert edited.prompt.one_shot is True and edited.prompt.system is None
    assert edited.prompt.instructions == default_prompt("cuda").instructions  # the rest stays CUDA's
    assert "load_inline" in edited.prompt.example


def test_a_misspelled_section_is_an_error_naming_it(tmp_path):
    from types import SimpleNamespace

    from slime_ext.slime_plugins.config import episode_config

    path = tmp_path / "r.yaml"
    path.write_text("kernel_rl:\n  episod: {max_turns: 3}\n  runner: {concurrency: 8}\n")
    with pytest.raises(ValidationError, match=r"kernel_rl\.episod \(did you mean kernel_rl\.episode\?\)"):
        load_recipe(path)
    # the same mapping handed to slime's plug-ins through --custom-config-path
    with pytest.raises(ValidationError, match="unknown recipe section kernel_rl.episod"):
        episode_config(SimpleNamespace(kernel_rl={"episod": {"max_turns": 3}}))


def test_a_value_of_the_wrong_type_names_the_key():
    with pytest.raises(ValidationError, match=r"kernel_rl\.episode\.max_turns: expected int, got str"):
        episode_config_from_dict({"max_turns": "three"})


def test_services_are_written_once_and_read_by_the_runner_and_the_plugins() -> None:
    from buffer_server.runner.config import runner_settings
    from slime_ext.rollout.recipe import with_services
    from slime_ext.slime_plugins.config import parse_plugin_config

    recipe = {
        "services": {"sglang_url": "http://h:1", "eval_urls": "http://e:2,http://e:3", "prompt_data": "/p",
                     "tokenizer": "/t", "buffer_url": "http://b:4"},
        "runner": {"concurrency": 4, "eval_urls": ["http://e:2", "http://e:3"]},  # the same, as a list
        "plugins": {"eval_urls": []},  # empty: unset
    }  # fmt: skip
    runner = runner_settings(recipe, {}).runner
    assert (runner.sglang_url, runner.eval_urls, runner.prompt_data, runner.tokenizer) == (
        "http://h:1", ("http://e:2", "http://e:3"), "/p", "/t")  # fmt: skip
    plugins = parse_plugin_config(recipe)
    assert (plugins.buffer_url, plugins.eval_urls, plugins.sglang_url) == (
        "http://b:4", ("http://e:2", "http://e:3"), "http://h:1")  # fmt: skip
    with pytest.raises(ValidationError, match=r"runner.sglang_url .* and kernel_rl.services.sglang_url .* differ"):
        with_services({**recipe, "runner": {"sglang_url": "http://other:9"}}, "runner", ("sglang_url",))
    with pytest.raises(ValidationError, match=r"unknown key kernel_rl.services.sglang_uri"):
        with_services({"services": {"sglang_uri": "x"}}, "runner", ("sglang_url",))
    # a recipe without `services` keeps working with the keys in each section
    alone = {"runner": {"sglang_url": "http://h:1", "eval_urls": "http://e:2", "prompt_data": "/p", "tokenizer": "/t"}}
    assert runner_settings(alone, {}).runner.sglang_url == "http://h:1"
    assert runner_settings({"services": recipe["services"]}, {}) is None  # no runner section, no flags
