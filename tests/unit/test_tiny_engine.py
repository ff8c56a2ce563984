"""slime_ext/dev_engine/engine.py: the /generate protocol over HTTP with the tiny model (CPU)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import torch

from slime_ext.dev_engine.engine import GenerateEngine
from slime_ext.dev_engine.scripted import ScriptedAnswer, choose_answer, context_key, mix_draw
from slime_ext.dev_engine.tiny_model import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[GenerateEngine, str]]:
    eng = GenerateEngine(tiny_model(), tiny_tokenizer(), seed=5, model_path="tiny")
    url = eng.start()
    yield eng, url
    eng.stop()


def _prompt() -> list[int]:
    return tiny_tokenizer().encode("<|im_start|>user\nrelu<|im_end|>\n<|im_start|>assistant\n")


def test_health_and_model_info(engine) -> None:
    _, url = engine
    assert httpx.get(f"{url}/health").status_code == 200
    info = httpx.get(f"{url}/get_model_info").json()
    assert info["is_generation"] is True and info["model_path"] == "tiny"


def test_generate_logprobs_match_teacher_forced_model(engine) -> None:
    _, url = engine
    prompt = _prompt()
    temperature = 0.7
    body = {
        "input_ids": prompt,
        "sampling_params": {"temperature": temperature, "max_new_tokens": 12},
        "return_logprob": True,
    }
    data = httpx.post(f"{url}/generate", json=body, timeout=60).json()
    meta = data["meta_info"]
    entries = meta["output_token_logprobs"]
    ids = [e[1] for e in entries]
    assert meta["completion_tokens"] == len(ids) and meta["prompt_tokens"] == len(prompt)
    assert 1 <= len(ids) <= 12
    finish = meta["finish_reason"]
    if finish["type"] == "length":
        assert len(ids) == 12 and finish["length"] == 12
    else:
        assert finish["type"] == "stop" and finish["matched"] == ids[-1]
    with torch.no_grad():
        logits = tiny_model()(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)] / temperature, dim=-1)
    expected = [float(lp[i, t]) for i, t in enumerate(ids)]
    assert [e[0] for e in entries] == pytest.approx(expected, abs=1e-4)
    assert data["text"] == tiny_tokenizer().decode(ids)


def test_stop_token_ids_and_without_logprobs(engine) -> None:
    eng, url = engine
    prompt = _prompt()
    # Find the first sampled token under a fixed seed, then ask to stop on it.
    eng.generator.manual_seed(11)
    first = httpx.post(
        f"{url}/generate",
        json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True},
    ).json()
    token = first["meta_info"]["output_token_logprobs"][0][1]
    eng.generator.manual_seed(11)
    data = httpx.post(
        f"{url}/generate",
        json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 30, "stop_token_ids": [token]}},
    ).json()
    assert data["meta_info"]["finish_reason"] == {"type": "stop", "matched": token}
    assert data["meta_info"]["completion_tokens"] == 1
    assert "output_token_logprobs" not in data["meta_info"]


def test_top_k_one_is_greedy(engine) -> None:
    _, url = engine
    prompt = _prompt()
    data = httpx.post(
        f"{url}/generate",
        json={
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 1, "top_k": 1, "temperature": 1.0},
        },
    ).json()
    with torch.no_grad():
        greedy = int(tiny_model()(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())
    assert data["meta_info"]["output_token_logprobs"][0][1] == greedy


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"sampling_params": {}}, "input_ids"),
        ({"input_ids": [1, 2], "sampling_params": {"temperature": 0}}, "temperature"),
        ({"input_ids": [1, 2], "sampling_params": {"bogus": 1}}, "bogus"),
        ({"input_ids": [1, 10**9]}, "outside the vocabulary"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
    ],
)
def test_bad_requests_get_400_naming_the_field(engine, body, message) -> None:
    _, url = engine
    r = httpx.post(f"{url}/generate", json=body)
    assert r.status_code == 400 and message in r.json()["error"]


def test_unknown_path_is_404(engine) -> None:
    _, url = engine
    assert httpx.post(f"{url}/v1/completions", json={}).status_code == 404


def test_scripted_rules_answer_matching_prompts_teacher_forced(tmp_path) -> None:
    from slime_ext.dev_engine.engine import load_scripted_rules

    rules_file = tmp_path / "rules.jsonl"
    rules_file.write_text('{"match": "relu", "text": "x = 1"}\n\n')
    rules = load_scripted_rules(str(rules_file))
    assert rules == [("relu", "x = 1")]
    tok = tiny_tokenizer()
    eng = GenerateEngine(tiny_model(), tok, seed=1, scripted_rules=rules)
    ids, logprobs, finish = eng.produce(
        _prompt(), temperature=0.9, max_new=50, stop_ids=set(), stops=[], top_p=1.0, top_k=-1, body={}
    )
    assert ids == tok.encode("x = 1", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert finish == {"type": "stop", "matched": ids[-1]} and all(lp <= 0 for lp in logprobs)
    # No rule matches: sampled as usual.
    other = tok.encode("<|im_start|>user\nsoftmax<|im_end|>\n<|im_start|>assistant\n")
    ids2, _, _ = eng.produce(
        other, temperature=0.9, max_new=3, stop_ids=set(), stops=[], top_p=1.0, top_k=-1, body={}
    )
    assert len(ids2) == 3
    rules_file.write_text('{"match": "", "text": "x"}\n')
    with pytest.raises(ValueError, match="rules.jsonl:1"):
        load_scripted_rules(str(rules_file))


def _teacher_forced_logprobs(prompt: list[int], ids: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = tiny_model()(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(ids)] / temperature, dim=-1)
    return [float(lp[i, t]) for i, t in enumerate(ids)]


def _post(url: str, prompt: list[int]) -> dict:
    body = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0.8, "max_new_tokens": 40},
        "return_logprob": True,
    }
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


MIX = [
    ScriptedAnswer("relu", "x = 1", True, "right"),
    ScriptedAnswer("relu", "y = 2", False, "wrong"),
    ScriptedAnswer("softmax", "z = 3", True, "softmax_right"),
    ScriptedAnswer("softmax", "no code", False, "softmax_wrong"),
]


def test_scripted_mix_draws_per_request_labels_and_teacher_forces() -> None:
    """SCRIPTED MIX: the k-th request with the same ids gets the answer that the seeded draw names
    (so a group's samples differ and a rerun repeats them); another context is counted apart;
    log-probs are the model's for the answer's tokens; meta_info and /health say it is scripted."""
    tok = tiny_tokenizer()
    eng = GenerateEngine(tiny_model(), tok, seed=4, scripted_rules=MIX, scripted_mix=0.5)
    url = eng.start()
    try:
        relu, softmax = _prompt(), tok.encode("<|im_start|>user\nsoftmax<|im_end|>\n<|im_start|>assistant\n")
        order = [relu, relu, relu, softmax, relu]
        answers = [_post(url, ids) for ids in order]
        health = httpx.get(f"{url}/health").json()
        info = httpx.get(f"{url}/get_model_info").json()
    finally:
        eng.stop()
    seen = {0: 0, 1: 0}
    for ids, data in zip(order, answers, strict=True):
        which = 0 if ids is relu else 1
        expected = choose_answer(
            MIX[2 * which : 2 * which + 2], 0.5, *mix_draw(context_key(4, ids), seen[which])
        )
        seen[which] += 1
        meta = data["meta_info"]
        assert meta["scripted"] == {
            "mode": "scripted-mix",
            "correct": expected.correct,
            "label": expected.label,
            "p": 0.5,
        }
        assert data["text"] == expected.text + "<|im_end|>"
        out = [e[1] for e in meta["output_token_logprobs"]]
        assert [e[0] for e in meta["output_token_logprobs"]] == pytest.approx(
            _teacher_forced_logprobs(ids, out, 0.8), abs=1e-4
        )
    assert {a["meta_info"]["scripted"]["correct"] for a in answers[:3]} == {
        True,
        False,
    }  # one group, both kinds
    status = {
        "mode": "scripted-mix",
        "p": 0.5,
        "seed": 4,
        "prompts": 2,
        "answers": {"correct": 2, "wrong": 2},
    }
    assert health == {"status": "ok", "scripted": status}
    assert info["scripted"] == status and info["device"] == "cpu" and info["dtype"] == "float32"
    # The same seed and requests give the same answers (reproducible run).
    again = GenerateEngine(tiny_model(), tok, seed=4, scripted_rules=MIX, scripted_mix=0.5)
    labels = [again.scripted_answer(ids).label for ids in order]
    assert labels == [a["meta_info"]["scripted"]["label"] for a in answers]


def test_plain_scripted_and_sampled_answers_are_labelled_apart(engine) -> None:
    _, url = engine
    assert "scripted" not in _post(url, _prompt())["meta_info"]  # the model's own answer
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    eng = GenerateEngine(
        tiny_model(), tiny_tokenizer(), seed=1, scripted_rules=[("relu", "x = 1")] + MIX[1:2]
    )
    scripted_url = eng.start()
    try:
        metas = [_post(scripted_url, _prompt())["meta_info"]["scripted"] for _ in range(3)]
    finally:
        eng.stop()
    assert metas == [{"mode": "scripted", "correct": True, "label": "", "p": None}] * 3  # wrong ones unused


def test_scripted_mix_needs_each_kind_it_can_draw() -> None:
    model, tok = tiny_model(), tiny_tokenizer()
    with pytest.raises(ValueError, match="no wrong answer for the prompt matching 'relu'"):
        GenerateEngine(model, tok, scripted_rules=MIX[:1], scripted_mix=0.5)
    with pytest.raises(ValueError, match="no correct answer"):
        GenerateEngine(model, tok, scripted_rules=MIX[1:2], scripted_mix=0.5)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        GenerateEngine(model, tok, scripted_rules=MIX, scripted_mix=1.5)
    assert (
        GenerateEngine(model, tok, scripted_rules=MIX[:1], scripted_mix=1.0)
        .scripted_answer(_prompt())
        .correct
    )
    assert (
        not GenerateEngine(model, tok, scripted_rules=MIX[1:2], scripted_mix=0.0)
        .scripted_answer(_prompt())
        .correct
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from slime_ext.dev_engine.tiny_model import write_model_dir

    return str(write_model_dir(tmp_path_factory.mktemp("tiny") / "model"))


def test_load_engine_dtype_device_and_bundled_mix(model_dir: str) -> None:
    from slime_ext.dev_engine.engine import load_engine

    eng = load_engine(model_dir, seed=2, scripted_mix=0.5, device="cpu", dtype="bfloat16")
    assert eng.model.dtype == torch.bfloat16 and str(eng.device) == "cpu"
    status = eng.scripted_status()
    assert status["prompts"] == 5 and status["answers"]["correct"] == 5 and status["answers"]["wrong"] >= 5
    ids, logprobs, finish = eng.sample(_prompt(), 1.0, 5, set())
    assert len(ids) == 5 and all(lp <= 0 for lp in logprobs) and finish["type"] == "length"
    with pytest.raises(ValueError, match="dtype"):
        load_engine(model_dir, dtype="int8")
    with pytest.raises(ValueError, match="device 'gpu0'"):
        load_engine(model_dir, device="gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cli_refuses_cuda_without_a_gpu(model_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    from slime_ext.dev_engine.engine import main

    with pytest.raises(SystemExit) as exc:
        main(["--model", model_dir, "--device", "cuda", "--scripted-mix", "0.5"])
    assert exc.value.code == 2 and "no CUDA device is visible" in capsys.readouterr().err


def test_sampling_uses_the_supported_cache_api(engine) -> None:
    """The KV cache goes by the name this transformers takes (`past_key_values` is deprecated in
    transformers 5 and goes in 5.40: a FutureWarning in every engine log, shown by the status
    window as the engine's last line)."""
    import warnings

    eng, _ = engine
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids, logprobs, _ = eng.sample(_prompt(), 0.7, 6, set())
    assert len(ids) == 6 and len(logprobs) == 6
    assert not [w for w in caught if "past_key_values" in str(w.message)], [str(w.message) for w in caught]
