"""The curriculum (buffer_server/runner/curriculum.py): advance on thresholds, mix-in of easier levels,
exhaustion, persistence across a restart (through the real store), outcome of an episode."""

from __future__ import annotations

import collections

import pytest

from buffer_server.runner.curriculum import Curriculum, CurriculumConfig, PromptSampler, episode_outcome
from buffer_server.store.buffer_store import BufferStore
from krl_common.settings import parse_settings
from krl_common.validation import ValidationError
from slime_ext.rollout.problems import PromptRecord

pytestmark = pytest.mark.unit


def prompts(levels: dict[int, int]) -> list[PromptRecord]:
    out = []
    for level, n in levels.items():
        for i in range(n):
            iid = f"L{level}_{i}"
            out.append(
                PromptRecord(instance_id=iid, level=level, problem_id=iid, name=iid, reference=f"# {iid}\n")
            )
    return out


def test_advances_only_when_window_and_both_rates_pass() -> None:
    cfg = CurriculumConfig(enabled=True, window=4, advance_correct_rate=0.5, advance_fast_1=0.25)
    cur = Curriculum(cfg, [1, 2, 3])
    for _ in range(3):
        assert not cur.record(1, True, True)  # window not full yet
    assert cur.tier == 0
    assert cur.record(1, False, False)  # 4 episodes: correct 3/4, fast 3/4
    assert (cur.tier, cur.current_level) == (1, 2)
    assert cur.history[-1]["reason"] == "thresholds" and cur.history[-1]["previous"]["correct_rate"] == 0.75
    # level 2: correct but never fast -> stays
    for _ in range(8):
        cur.record(2, True, False)
    assert cur.tier == 1
    assert cur.rates(2) == {"window_episodes": 4, "total_episodes": 8, "correct_rate": 1.0, "fast_1": 0.0}
    cur.record(2, True, True)  # fast 1/4 >= 0.25
    assert cur.tier == 2
    cur.record(1, True, True)  # an easier level's outcome never moves the tier
    for _ in range(10):
        assert not cur.record(3, True, True)  # last tier: no further advance
    assert cur.tier == 2


def test_fast_1_not_required_and_min_episodes() -> None:
    cfg = CurriculumConfig(
        enabled=True, window=10, min_episodes=2, advance_correct_rate=1.0, advance_fast_1=None
    )
    cur = Curriculum(cfg, [1, 2])
    cur.record(1, True, False)
    assert cur.tier == 0
    cur.record(1, True, False)
    assert cur.tier == 1


def test_mix_weights() -> None:
    cfg = CurriculumConfig(enabled=True, mode="mix", mix_new_level_weight=0.6, window=1, advance_fast_1=None)
    cur = Curriculum(cfg, [1, 2, 3])
    assert cur.weights() == {1: 1.0}
    cur.record(1, True, False)
    assert cur.weights() == pytest.approx({1: 0.4, 2: 0.6})
    cur.record(2, True, False)
    assert cur.weights() == pytest.approx({1: 0.2, 2: 0.2, 3: 0.6})


def test_sampler_mix_draws_easier_levels_too() -> None:
    cfg = CurriculumConfig(enabled=True, mode="mix", window=1, advance_fast_1=None, mix_new_level_weight=0.5)
    sampler = PromptSampler(prompts({1: 50, 2: 50}), group_size=1, epochs=5, seed=3, curriculum=cfg)
    assert {sampler.next().prompt.level for _ in range(10)} == {1}
    assert sampler.record(1, True, False)  # advance to tier 1: levels 1 and 2 mixed
    counts = collections.Counter(sampler.next().prompt.level for _ in range(200))
    assert 60 <= counts[2] <= 140 and counts[1] + counts[2] == 200


def test_sampler_advance_mode_exhaustion_and_finish() -> None:
    cfg = CurriculumConfig(enabled=True, window=100, levels=(1, 2))
    sampler = PromptSampler(prompts({1: 2, 2: 1, 3: 4}), group_size=2, epochs=1, seed=0, curriculum=cfg)
    assert sampler.excluded == {3: 4}  # level 3 is not in curriculum.levels
    levels = []
    while (task := sampler.next()) is not None:
        levels.append(task.prompt.level)
    assert levels == [1, 1, 2] and sampler.finished
    cur = sampler.curriculum
    assert cur is not None and cur.tier == 1 and cur.history[-1]["reason"] == "exhausted"
    stats = sampler.stats()
    assert stats["curriculum"]["level"] == 2 and stats["queues"]["1"]["exhausted"]


def test_sampler_without_curriculum_is_one_queue() -> None:
    sampler = PromptSampler(prompts({1: 2, 2: 2}), group_size=1, epochs=2, seed=0)
    assert len([sampler.next() for _ in range(4)]) == 4
    assert sampler.epoch == 1 and not sampler.finished
    sampler.next(), sampler.next(), sampler.next(), sampler.next()
    assert sampler.finished and sampler.next() is None
    assert sampler.stats()["curriculum"] == {"enabled": False}


def test_state_survives_restart_through_the_store(tmp_path) -> None:
    cfg = CurriculumConfig(enabled=True, window=3, advance_correct_rate=0.6, advance_fast_1=None)
    cur = Curriculum(cfg, [1, 2])
    for ok in (True, True, True, False, True):
        cur.record(1 if cur.tier == 0 else 2, ok, False)
    before = cur.stats()
    with BufferStore(tmp_path / "b.sqlite") as store:
        store.set_meta("runner.curriculum", cur.to_json())
    with BufferStore(tmp_path / "b.sqlite") as store:
        resumed = Curriculum(cfg, [1, 2], store.get_meta("runner.curriculum"))
    assert resumed.stats() == before and resumed.tier == 1
    assert resumed.rates(2)["window_episodes"] == 2
    # levels changed since: start again at tier 0 rather than misread the state
    assert Curriculum(cfg, [1, 2, 3], cur.to_json()).tier == 0
    with pytest.raises(ValueError, match="stored state is not usable"):
        Curriculum(cfg, [1, 2], '{"version": 99}')


def test_config_errors_name_the_key() -> None:
    path = "kernel_rl.curriculum"
    with pytest.raises(ValidationError, match="unknown field"):
        parse_settings(CurriculumConfig, {"windw": 3}, path)
    for bad, match in (
        ({"mode": "jump"}, "mode must be one of"),
        ({"window": 0}, "window must be"),
        ({"window": 4, "min_episodes": 5}, "min_episodes"),
        ({"advance_correct_rate": 1.5}, "advance_correct_rate"),
        ({"levels": [1, 1]}, "must not repeat"),
        ({"mix_new_level_weight": 0}, "mix_new_level_weight"),
    ):
        with pytest.raises(ValidationError, match=match):
            parse_settings(CurriculumConfig, bad, path)
    assert parse_settings(CurriculumConfig, {"levels": [1, 2]}, path).levels == (1, 2)


def test_episode_outcome() -> None:
    assert episode_outcome([None, {"correct": False}]) == (False, False)
    assert episode_outcome([{"correct": True, "speedup": None}]) == (True, False)
    assert episode_outcome([{"correct": True, "speedup": 0.9}, {"correct": True, "speedup": 1.3}]) == (
        True,
        True,
    )
    assert episode_outcome([{"correct": False, "speedup": 3.0}]) == (False, False)
