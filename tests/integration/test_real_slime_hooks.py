"""Every plug-in against slime's OWN plug-in contract tests (`tests/plugin_contracts/` of THUDM/slime
@ 624b824a, imported from slime's source; skipped without it): parameter names exactly as slime's
contract tests expect them, the call sites those tests pin still in slime's code, and our RM
called through slime's real reward dispatch (`async_rm`, `batched_async_rm`)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace

import pytest

from tests.real_slime import real_slime, slime_src

pytestmark = pytest.mark.integration

PLUGINS = "slime_ext.slime_plugins"


@pytest.fixture(scope="module")
def contracts() -> Iterator[dict[str, ModuleType]]:
    """slime's contract test modules (they put slime's tests/ dir on sys.path and stub Ray,
    SGLang's router and transformers only where those are not imported already)."""
    with real_slime():
        import transformers  # noqa: F401  (the real one, before slime's contract stubs look)

        tests_dir = slime_src() / "tests"
        sys.path.insert(0, str(tests_dir))
        names = ("runtime_hook", "rollout", "generate", "path_loading")
        try:
            yield {n: importlib.import_module(f"plugin_contracts.test_plugin_{n}_contracts") for n in names}
        finally:
            for name, module in list(sys.modules.items()):  # slime's test modules only
                if str(getattr(module, "__file__", None) or "").startswith(str(tests_dir)):
                    del sys.modules[name]


def _load(path: str) -> Callable[..., object]:
    from slime.utils.misc import load_function  # slime's loader, as for every --*-path flag

    return load_function(path)


@pytest.mark.parametrize(
    ("case", "path"),
    [
        ("custom_rollout_log", f"{PLUGINS}.rollout_log.log_rollout"),
        ("custom_eval_rollout_log", f"{PLUGINS}.rollout_log.log_eval_rollout"),
        ("custom_reward_post_process", f"{PLUGINS}.reward_post.post_process"),
    ],
)
def test_runtime_hooks_match_slimes_contract(contracts: dict[str, ModuleType], case: str, path: str) -> None:
    (hook,) = [c for c in contracts["runtime_hook"].HOOK_CASES if c.name == case]
    assert hook.runtime_marker in (slime_src() / hook.source_path).read_text()  # slime's call site
    assert tuple(inspect.signature(_load(path)).parameters) == hook.expected_params


def test_rollout_and_eval_function_match_slimes_default(contracts: dict[str, ModuleType]) -> None:
    fn = _load(f"{PLUGINS}.rollout.generate_rollout")
    contracts["rollout"].assert_rollout_function_signature_matches_default(fn)  # also the eval fn


def test_generate_matches_slimes_contract(contracts: dict[str, ModuleType]) -> None:
    fn = _load(f"{PLUGINS}.generate.generate")
    contracts["generate"].assert_custom_generate_signature_matches_expected(fn)
    assert "evaluation" in inspect.signature(fn).parameters  # slime then passes evaluation=


def test_rm_through_slimes_reward_dispatch(contracts: dict[str, ModuleType]) -> None:
    from slime.rollout.rm_hub import async_rm, batched_async_rm
    from slime.utils.types import Sample

    path = f"{PLUGINS}.generate.reward"
    reference = contracts["path_loading"].reference_single_rm
    names = tuple(inspect.signature(_load(path)).parameters)
    assert names[:2] == tuple(inspect.signature(reference).parameters)[:2] == ("args", "sample")
    args = SimpleNamespace(custom_rm_path=path, group_rm=False, rm_type=None, reward_key=None)
    one = Sample(index=0, reward=0.3)
    assert asyncio.run(async_rm(args, one)) == 0.3  # per sample
    fan_out = [Sample(index=1, rollout_id=1, reward=0.22), Sample(index=1, rollout_id=1, reward=0.3)]
    assert asyncio.run(batched_async_rm(args, fan_out)) == [0.22, 0.3]  # a list-returning generate
    with pytest.raises(ValueError, match="no reward"):
        asyncio.run(async_rm(args, Sample(index=2)))
