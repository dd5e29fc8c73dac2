"""Tests for pytest_specenergy.cases.corpora: built-in corpora, the Corpus value object, JSONL
loading."""

from __future__ import annotations

import dataclasses
import json
import re
from importlib import resources
from pathlib import Path

import pytest

from pytest_specenergy.cases.corpora import BUILTIN_CORPORA
from pytest_specenergy.cases.corpora import Corpus
from pytest_specenergy.cases.corpora import CorpusError
from pytest_specenergy.cases.corpora import load_corpus

# Function words that are frequent in Rumantsch Grischun news text and rare in English.
ROMANSH_MARKERS = {
    "da",
    "ils",
    "la",
    "las",
    "e",
    "ed",
    "cun",
    "en",
    "il",
    "per",
    "che",
    "è",
    "èn",
    "han",
    "ha",
}
# English function words with no Romansh homograph ("in" and "a" are left out on purpose).
ENGLISH_STOPWORDS = {
    "the",
    "and",
    "of",
    "to",
    "is",
    "was",
    "that",
    "with",
    "for",
    "which",
    "are",
    "this",
}


def _words(text: str) -> list[str]:
    return re.findall(r"[^\W\d_]+", text.lower())


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f"jsonl:{path}"


# --- built-in corpora -------------------------------------------------------------------


def test_builtin_names_are_the_five_paper_corpora() -> None:
    assert BUILTIN_CORPORA == ("code", "conversation", "long-document", "news", "rm-news")


@pytest.mark.parametrize("name", BUILTIN_CORPORA)
def test_builtin_has_at_least_32_distinct_nonempty_prompts(name: str) -> None:
    corpus = load_corpus(name)
    assert corpus.name == name
    assert corpus.source == "built-in"
    assert len(corpus) >= 32
    assert len(set(corpus.prompts)) == len(corpus.prompts)
    assert all(isinstance(p, str) and p.strip() for p in corpus.prompts)
    assert re.fullmatch(r"[0-9a-f]{64}", corpus.digest)


@pytest.mark.parametrize("name", BUILTIN_CORPORA)
def test_builtin_data_file_is_packaged_with_unique_ids(name: str) -> None:
    # The file must be reachable through importlib.resources, as it is from an installed wheel.
    resource = resources.files("pytest_specenergy.cases.corpora").joinpath("data", f"{name}.jsonl")
    records = [
        json.loads(line) for line in resource.read_text(encoding="utf-8").splitlines() if line
    ]
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids))
    assert all(i.startswith(f"{name}-") for i in ids)
    assert [r["prompt"] for r in records] == list(load_corpus(name).prompts)


def test_builtin_is_cached() -> None:
    assert load_corpus("code") is load_corpus("code")


def test_long_document_prompts_are_long() -> None:
    for prompt in load_corpus("long-document").prompts:
        document, _, task = prompt.rpartition("\n\n")
        assert len(document) >= 1500, prompt[:80]
        assert len(prompt) <= 3500, prompt[:80]
        assert task.strip(), "each document is followed by a task"


def test_code_corpus_includes_snippets_to_modify() -> None:
    # n-gram drafting profits from text that repeats the prompt; enough prompts must carry code.
    with_snippet = [p for p in load_corpus("code").prompts if "```" in p]
    assert len(with_snippet) >= 10


def test_rm_news_is_romansh_not_english() -> None:
    corpus = load_corpus("rm-news")
    total_words = 0
    total_english = 0
    for prompt in corpus.prompts:
        words = _words(prompt)
        romansh = sum(w in ROMANSH_MARKERS for w in words)
        english = sum(w in ENGLISH_STOPWORDS for w in words)
        assert romansh >= 5, prompt
        assert english == 0, prompt
        total_words += len(words)
        total_english += english
        # The task is in Romansh too, not an English instruction.
        task = prompt.rpartition("\n\n")[2]
        assert not re.search(r"\b(continue|write|article|summari[sz]e)\b", task, re.I), task
    assert total_english / total_words < 0.01


def test_english_news_is_english() -> None:
    # The English/Romansh contrast is the point of the two news corpora; check the other side.
    for prompt in load_corpus("news").prompts:
        words = _words(prompt)
        assert sum(w in ENGLISH_STOPWORDS for w in words) >= 5, prompt


# --- Corpus value object ----------------------------------------------------------------


def test_digest_is_stable_and_content_based() -> None:
    a = Corpus("x", ("one", "two"), "built-in")
    b = Corpus("y", ["one", "two"], "/elsewhere.jsonl")
    assert a.digest == b.digest  # name and source do not enter the digest
    assert b.prompts == ("one", "two")  # lists are normalised to tuples
    assert a.digest == Corpus("x", ("one", "two")).digest
    # Pinned value: a change to the digest scheme would invalidate every stored baseline.
    assert a.digest == "498df273324bee201df861e314588ff29b6ed8b15f11e3307430076d1f93c7ab"
    assert load_corpus("news").digest == load_corpus("news").digest


def test_digest_changes_when_prompts_change() -> None:
    base = Corpus("x", ("one", "two")).digest
    assert Corpus("x", ("one", "two!")).digest != base
    assert Corpus("x", ("two", "one")).digest != base  # order matters: take(n) is order-dependent
    assert Corpus("x", ("one", "two", "three")).digest != base
    # Length-prefixing means re-splitting the same characters cannot collide.
    assert Corpus("x", ("ab", "c")).digest != Corpus("x", ("a", "bc")).digest


def test_wrong_digest_is_rejected() -> None:
    with pytest.raises(CorpusError, match="does not match its prompts"):
        Corpus("x", ("one",), "built-in", "0" * 64)


def test_empty_corpus_and_empty_prompt_are_rejected() -> None:
    with pytest.raises(CorpusError, match="empty"):
        Corpus("x", ())
    with pytest.raises(CorpusError, match="non-empty string"):
        Corpus("x", ("ok", "   "))


def test_corpus_is_frozen() -> None:
    corpus = Corpus("x", ("one",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        corpus.name = "y"  # type: ignore[misc]


def test_take_returns_prefix_and_cycles() -> None:
    corpus = Corpus("x", ("a", "b", "c"))
    assert corpus.take(0) == ()
    assert corpus.take(2) == ("a", "b")
    assert corpus.take(3) == ("a", "b", "c")
    assert corpus.take(7) == ("a", "b", "c", "a", "b", "c", "a")
    big = load_corpus("code")
    assert big.take(100)[len(big) :] == big.take(100 - len(big))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_take_rejects_bad_n(bad: object) -> None:
    with pytest.raises(CorpusError, match="non-negative integer"):
        Corpus("x", ("a",)).take(bad)  # type: ignore[arg-type]


def test_load_corpus_passes_corpus_through() -> None:
    corpus = Corpus("mine", ("p",), "test")
    assert load_corpus(corpus) is corpus


# --- jsonl:PATH -------------------------------------------------------------------------


def test_jsonl_loads_prompt_and_text_fields(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    spec = _write(
        path,
        [
            json.dumps({"id": 1, "prompt": "First prompt"}),
            "",
            "   ",
            json.dumps({"text": "Segund prompt cun ü è"}, ensure_ascii=False),
            json.dumps({"prompt": "Third", "extra": [1, 2]}),
        ],
    )
    corpus = load_corpus(spec)
    assert corpus.prompts == ("First prompt", "Segund prompt cun ü è", "Third")
    assert corpus.name == "mine"
    assert corpus.source == str(path.resolve())
    assert corpus.digest == Corpus("other", corpus.prompts).digest


def test_jsonl_relative_path_and_bom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bom.jsonl").write_bytes(
        b"\xef\xbb\xbf" + json.dumps({"prompt": "hi"}).encode() + b"\n"
    )
    monkeypatch.chdir(tmp_path)
    assert load_corpus("jsonl:bom.jsonl").prompts == ("hi",)


def test_jsonl_cache_and_reload_on_change(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    spec = _write(path, [json.dumps({"prompt": "one"})])
    first = load_corpus(spec)
    assert load_corpus(spec) is first
    _write(path, [json.dumps({"prompt": "one"}), json.dumps({"prompt": "two"})])
    # Size changed, so the cache key changes even on filesystems with coarse mtimes.
    second = load_corpus(spec)
    assert second.prompts == ("one", "two")
    assert second.digest != first.digest


def test_unknown_name_lists_valid_names_and_jsonl_form() -> None:
    with pytest.raises(CorpusError) as info:
        load_corpus("poetry")
    message = str(info.value)
    assert "unknown corpus 'poetry'" in message
    for name in BUILTIN_CORPORA:
        assert name in message
    assert "jsonl:PATH" in message


def test_unknown_name_suggests_close_match_and_prefix() -> None:
    with pytest.raises(CorpusError, match="did you mean 'rm-news'"):
        load_corpus("rm_news")
    with pytest.raises(CorpusError, match="write jsonl:prompts.jsonl"):
        load_corpus("prompts.jsonl")


def test_non_string_spec_is_rejected() -> None:
    with pytest.raises(CorpusError, match="must be a str or Corpus, got int"):
        load_corpus(3)  # type: ignore[arg-type]


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(CorpusError) as info:
        load_corpus(f"jsonl:{missing}")
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)


def test_empty_path_and_directory(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="empty path"):
        load_corpus("jsonl:")
    with pytest.raises(CorpusError, match="not a regular file"):
        load_corpus(f"jsonl:{tmp_path}")


def test_line_that_is_not_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    spec = _write(path, [json.dumps({"prompt": "ok"}), "", "{not json"])
    with pytest.raises(CorpusError) as info:
        load_corpus(spec)
    message = str(info.value)
    assert str(path.resolve()) in message
    assert "line 3" in message  # blank lines still count, so the number matches an editor
    assert "not valid JSON" in message


def test_a_lone_surrogate_is_refused_naming_the_line(tmp_path: Path) -> None:
    # json.loads accepts "\ud800"; the text then cannot be encoded, hashed or sent.
    spec = _write(
        tmp_path / "sur.jsonl", [json.dumps({"prompt": "ok"}), '{"prompt": "bad \\ud800 here"}']
    )
    with pytest.raises(
        CorpusError, match=r"line 2: the 'prompt' field holds '\\ud800' at character 4, a lone"
    ):
        load_corpus(spec)


def test_line_that_is_not_an_object(tmp_path: Path) -> None:
    spec = _write(tmp_path / "list.jsonl", ['["a", "b"]'])
    with pytest.raises(CorpusError, match=r"line 1: expected a JSON object .* got a JSON list"):
        load_corpus(spec)


def test_line_without_prompt_field(tmp_path: Path) -> None:
    path = tmp_path / "noprompt.jsonl"
    spec = _write(path, [json.dumps({"prompt": "ok"}), json.dumps({"question": "where?", "id": 2})])
    with pytest.raises(CorpusError) as info:
        load_corpus(spec)
    message = str(info.value)
    assert "line 2" in message
    assert "'prompt' or 'text'" in message
    assert "found: id, question" in message


@pytest.mark.parametrize("value", ["", "   ", 42, None])
def test_empty_or_non_string_prompt_field(tmp_path: Path, value: object) -> None:
    spec = _write(tmp_path / "v.jsonl", [json.dumps({"prompt": value})])
    with pytest.raises(CorpusError, match="line 1: no non-empty string 'prompt'"):
        load_corpus(spec)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CorpusError) as info:
        load_corpus(f"jsonl:{path}")
    assert str(path.resolve()) in str(info.value)
    assert "contains no prompts" in str(info.value)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"prompt": "Mustér"}\n'.encode("latin-1"))
    with pytest.raises(CorpusError, match="not UTF-8"):
        load_corpus(f"jsonl:{path}")


def test_corpus_error_is_value_error() -> None:
    assert issubclass(CorpusError, ValueError)


def test_a_packaged_corpus_parsed_at_once_gives_the_prompts_and_errors_of_line_by_line():
    """The one-parse fast path of the packaged corpora reads what the JSONL reader reads, and a
    line it cannot take falls back to that reader, whose message names the line."""
    from pytest_specenergy.cases.corpora.loader import _builtin_prompts
    from pytest_specenergy.cases.corpora.loader import _iter_prompts

    good = '{"id": "a", "prompt": "one"}\n\n{"prompt": "two \\u00e9"}\n'
    assert (
        _builtin_prompts(good, "w")
        == tuple(_iter_prompts(good.splitlines(), "w"))
        == ("one", "two é")
    )
    # the reader's fallback field
    assert _builtin_prompts('{"text": "only text"}\n', "w") == ("only text",)
    for bad, expected in (
        ('{"prompt": "ok"}\n{"prompt": \n', "line 2: not valid JSON"),
        ('{"prompt": "ok"}\n[1]\n', "line 2: expected a JSON object"),
        ('{"prompt": "ok"}\n{"prompt": "  "}\n', "line 2: no non-empty string"),
    ):
        with pytest.raises(CorpusError, match=expected):
            _builtin_prompts(bad, "built-in corpus 'x'")
