"""A resumed run's engines serve the resumed weights (slime_ext.slime_plugins.resume_weights): the
checkpoint slime resumed from is converted by our real converter, and every SGLang worker behind
the router is told to load it, against a labelled TEST DOUBLE of the router's `GET /workers` and
SGLang's `POST /update_weights_from_disk` (request {"model_path": ...}; 200 {"success": true, ...}
or 400 {"success": false, "message": ...}, as SGLang's http_server answers). The double reads the
safetensors it is pointed at, so the test sees which weights a worker would serve."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from slime_ext.convert import hf_to_megatron
from slime_ext.convert.tiny_models import write_tiny_hf_model
from slime_ext.slime_plugins import resume_weights
from tests.router_double import JsonHandler, serve_router
from tests.unit.test_convert_roundtrip import load_hf

pytestmark = pytest.mark.integration

RESUMED = 9  # the iteration slime saved last; it resumes at rollout RESUMED + 1


@dataclass
class Workers:
    """TEST DOUBLE (not SGLang, not its router): `n` workers on one port (paths /w0, /w1, ...); a
    worker in `refuse` answers 400 as SGLang does when the load fails. `loaded` holds, per worker,
    the tensors of each model_path it was asked to load."""

    n: int = 2
    refuse: set[int] = field(default_factory=set)
    loaded: dict[int, list[dict[str, torch.Tensor]]] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)


@contextmanager
def serve(workers: Workers) -> Iterator[SimpleNamespace]:
    """The double on loopback; yields slime's router arguments pointing at it."""

    class Handler(JsonHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/workers":
                self.send_error(404)
                return
            self.reply(200, {"workers": [{"url": f"{self.base_url()}/w{i}"} for i in range(workers.n)]})

        def do_POST(self) -> None:  # noqa: N802
            body = self.body()
            worker, _, endpoint = self.path.strip("/").partition("/")
            if endpoint != "update_weights_from_disk" or not worker.startswith("w"):
                self.send_error(404)
                return
            i = int(worker[1:])
            workers.paths.append(body["model_path"])
            if i in workers.refuse:
                self.reply(
                    400,
                    {"success": False, "message": "Failed to get weights iterator", "num_paused_requests": 0},
                )
                return
            workers.loaded.setdefault(i, []).append(load_hf(Path(body["model_path"])))
            self.reply(
                200,
                {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0},
            )

    with serve_router(Handler) as args:
        yield args


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The base model (HF, slime's --hf-checkpoint) and a run's --load holding iteration RESUMED of
    different weights (another seed: what training moved)."""
    root = tmp_path_factory.mktemp("resume")
    base, trained = root / "base", root / "trained"
    write_tiny_hf_model("qwen3", base, seed=0)
    write_tiny_hf_model("qwen3", trained, seed=1)
    load = root / "run" / "checkpoints"
    hf_to_megatron(trained, load, iteration=RESUMED, progress=False)
    return SimpleNamespace(base=base, trained=trained, load=load)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    resume_weights.reset()
    yield
    resume_weights.reset()


def slime_args(models: SimpleNamespace, router: SimpleNamespace, **over: object) -> SimpleNamespace:
    """The slime arguments the module reads: a non-colocated run with KL loss (a reference model)."""
    args = dict(
        colocate=False, use_kl_loss=True, kl_coef=0.0, load=str(models.load), hf_checkpoint=str(models.base),
        ckpt_step=None, debug_train_only=False, debug_rollout_only=False, **vars(router),
    )  # fmt: skip
    args.update(over)
    return SimpleNamespace(**args)


@pytest.mark.parametrize("rollout_id", [RESUMED + 1, None], ids=["rollout-id", "latest-checkpoint"])
def test_every_worker_loads_the_checkpoint_slime_resumed_from(
    models: SimpleNamespace, rollout_id: int | None
) -> None:
    workers = Workers(n=2)
    with serve(workers) as router:
        args = slime_args(models, router)
        metrics = resume_weights.ensure_resumed_weights(args, rollout_id)
        again = resume_weights.ensure_resumed_weights(args, rollout_id)
    assert metrics["rollout/resume/engines_reloaded"] == 2.0 and again == {}  # once per process
    hf = models.load.with_name("checkpoints_hf") / f"iter_{RESUMED:07d}"
    assert workers.paths == [str(hf)] * 2
    want, base = load_hf(models.trained), load_hf(models.base)
    for i in (0, 1):
        [got] = workers.loaded[i]
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)  # the trained weights, bit-exact
        assert any(not torch.equal(got[k], base[k]) for k in want)  # not the reference's


def test_the_hf_copy_is_removed_once_loaded_and_kept_for_a_retry(models: SimpleNamespace) -> None:
    hf = models.load.with_name("checkpoints_hf") / f"iter_{RESUMED:07d}"
    workers = Workers(n=1, refuse={0})
    with serve(workers) as router:
        args = slime_args(models, router)
        with pytest.raises(RuntimeError, match="readable on the worker's host"):
            resume_weights.ensure_resumed_weights(args, RESUMED + 1)
        assert hf.is_dir()  # kept: the retry does not convert again
        workers.refuse.clear()
        metrics = resume_weights.ensure_resumed_weights(args, RESUMED + 1)
    assert metrics["rollout/resume/convert_s"] == 0.0 and metrics["rollout/resume/engines_reloaded"] == 1.0
    assert not hf.exists()  # the engines hold the weights; the checkpoint stays in --load
    assert (models.load / f"iter_{RESUMED:07d}").is_dir()


@pytest.mark.parametrize(
    ("over", "rollout_id"),
    [
        ({"colocate": True}, RESUMED + 1),  # the push reads the actor's backup
        ({"use_kl_loss": False}, RESUMED + 1),  # no reference model loaded
        ({"use_kl_loss": False, "kl_coef": 0.0}, None),
        ({}, 0),  # a fresh start: actor and reference are the same weights
        ({}, RESUMED + 3),  # no checkpoint at that iteration: slime did not resume from it
        ({"debug_train_only": True}, RESUMED + 1),  # no engines
        ({"load": None}, RESUMED + 1),
        ({"ref_load": "LOAD"}, None),  # slime's fresh start: --load is --ref-load
    ],
)
def test_nothing_is_reloaded_where_slime_pushed_the_right_weights(
    models: SimpleNamespace, over: dict, rollout_id: int | None
) -> None:
    workers = Workers(n=1)
    if over.get("ref_load") == "LOAD":
        over = {"ref_load": str(models.load)}
    with serve(workers) as router:
        assert resume_weights.ensure_resumed_weights(slime_args(models, router, **over), rollout_id) == {}
    assert workers.paths == []


def test_a_nonzero_kl_coef_alone_loads_the_reference_too(models: SimpleNamespace) -> None:
    workers = Workers(n=1)
    with serve(workers) as router:
        args = slime_args(models, router, use_kl_loss=False, kl_coef=0.05)
        assert (
            resume_weights.ensure_resumed_weights(args, RESUMED + 1)["rollout/resume/engines_reloaded"] == 1.0
        )


def test_a_worker_that_refuses_fails_the_step_and_the_next_call_tries_again(models: SimpleNamespace) -> None:
    workers = Workers(n=2, refuse={1})
    with serve(workers) as router:
        args = slime_args(models, router)
        with pytest.raises(
            RuntimeError, match=r"/w1 did not load the resumed weights .* 'Failed to get weights iterator'"
        ):
            resume_weights.ensure_resumed_weights(args, RESUMED + 1)
        assert not resume_weights.resume_checked()
        workers.refuse.clear()
        assert (
            resume_weights.ensure_resumed_weights(args, RESUMED + 1)["rollout/resume/engines_reloaded"] == 2.0
        )


def test_in_slime_generate_reloads_before_its_first_episode(
    models: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MODE=in_slime: slime's own rollout calls our generate per sample, without the rollout id;
    the first call loads the checkpoint slime resumed from (the latest of --load) into the
    workers before anything of the episode runs, later calls do not."""
    import asyncio

    from slime_ext.slime_plugins import generate as gen

    class Stop(Exception):
        pass

    seen: list[list[str]] = []

    async def no_episode(*args: object, **kwargs: object) -> None:  # the episode's first step
        seen.append(list(workers.paths))
        raise Stop

    monkeypatch.setattr(gen, "get_resources", no_episode)
    workers = Workers(n=1)
    sample = SimpleNamespace(prompt="import torch\n", label=None, metadata={}, session_id=None)
    with serve(workers) as router:
        args = slime_args(models, router, kernel_rl={}, rollout_temperature=0.7)
        for _ in range(2):
            with pytest.raises(Stop):
                asyncio.run(gen.generate(args, sample, {"temperature": 0.7}))
    hf = str(models.load.with_name("checkpoints_hf") / f"iter_{RESUMED:07d}")
    assert seen == [[hf], [hf]]  # loaded before the first episode, and only once
