"""generation(chat=True): the marker, the case id, and the ids the plugin sends."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_specenergy.cases import chat
from pytest_specenergy.cases.markers import CaseDefaults
from pytest_specenergy.cases.markers import MarkerError
from pytest_specenergy.cases.markers import build_cases
from pytest_specenergy.engines.prompts import generate_input
from pytest_specenergy.refserver.catalog import checkpoint_dir
from pytest_specenergy.refserver.catalog import is_ready


def _closest(**marks):
    def closest(name):
        value = marks.get(name)
        if value is None:
            return None
        args, kwargs = value if isinstance(value, tuple) else (value, {})
        return SimpleNamespace(args=tuple(args), kwargs=dict(kwargs))

    return closest


def _cases(model: str, **generation):
    closest = _closest(
        model=[model],
        drafter=["ngram"],
        batch=[1],
        corpus=["conversation"],
        generation=([], generation),
    )
    return build_cases("t.py::test", closest, CaseDefaults())


def test_chat_is_in_the_id_and_the_record_only_when_asked():
    (plain,) = _cases("smollm2-135m")
    (chatty,) = _cases("smollm2-135m", chat=True)
    assert plain.id == "conversation-ngram-b1" and chatty.id == "conversation-chat-ngram-b1"
    assert chatty.as_dict()["generation"]["chat"] is True
    # absent when off: runs stored before chat existed stay comparable (same generation dict)
    assert plain.as_dict()["generation"] == {
        "max_new_tokens": 64,
        "prompts": None,
        "ignore_eos": False,
        "temperature": 0.0,
    }
    assert plain.baseline_key() != chatty.baseline_key()  # not one shared baseline arm


@pytest.mark.parametrize("bad", ["yes", 1])
def test_a_non_boolean_chat_is_a_marker_error(bad):
    with pytest.raises(MarkerError, match=rf"generation\(chat={bad!r}\): expected True or False"):
        _cases("smollm2-135m", chat=bad)


def test_tiny_models_have_no_chat_template_said_at_collection():
    with pytest.raises(MarkerError, match="built-in tiny and random models have no chat template"):
        _cases("tiny:dense", chat=True)


def test_generate_input_sends_ids_as_input_ids_and_refuses_a_mix():
    assert generate_input(["a", "b"]) == {"text": ["a", "b"]}
    assert generate_input([(1, 2), (3,)]) == {"input_ids": [[1, 2], [3]]}
    with pytest.raises(ValueError, match="mixes text prompts and token-id prompts"):
        generate_input(["a", (1,)])


@pytest.mark.skipif(not is_ready("smollm2-135m"), reason="smollm2-135m is not cached")
def test_the_pool_is_the_models_own_chat_rendering():
    """What SGLang's chat endpoint would send: the template's default system turn, the user turn,
    the assistant turn opened; no second BOS."""
    from transformers import AutoTokenizer

    (case,) = _cases("smollm2-135m", chat=True, prompts=2)
    pool = case.pool()
    tok = AutoTokenizer.from_pretrained(str(checkpoint_dir("smollm2-135m")))
    texts = case.corpus.take(2)
    for ids, text in zip(pool, texts):
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        assert list(ids) == tok.encode(rendered, add_special_tokens=False)
        assert rendered.startswith("<|im_start|>system\n") and rendered.endswith(
            f"{text}<|im_end|>\n<|im_start|>assistant\n"
        )


def test_a_model_without_a_template_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(chat, "_tokenizer", lambda path: SimpleNamespace(chat_template=None))
    monkeypatch.setattr(chat, "ensure_fetched", lambda model: "/models/base")
    with pytest.raises(chat.ChatTemplateError, match="model /models/base-lm has no chat template"):
        chat.chat_prompts("/models/base-lm", ("hi",))


def test_coherence_scores_a_token_id_pool_without_asking_the_engine_to_tokenise():
    from pytest_specenergy.measure.coherence import prompt_token_ids

    class NoCalls:
        def generate(self, *args, **kwargs):
            raise AssertionError("a token-id prompt needs no tokenisation by the engine")

    assert prompt_token_ids(NoCalls(), [(1, 2, 3), (4,)]) == [[1, 2, 3], [4]]
