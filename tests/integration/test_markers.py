"""Markers -> ids -> collection errors, through pytest-in-pytest (no engine starts)."""

from __future__ import annotations

import pytest

HEADER = """
import pytest
from pytest_specenergy import Drafter
"""


def test_markers_are_registered_and_strict(pytester: pytest.Pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.model(name_or_path, *",
            "@pytest.mark.drafter(*names_or_Drafter)*",
            "@pytest.mark.batch(*ints)*",
            "@pytest.mark.corpus(*names_or_Corpus)*",
            "@pytest.mark.generation(max_new_tokens=64*",
        ]
    )
    pytester.makepyfile(
        HEADER
        + """
pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("code")]

@pytest.mark.drafter("ngram")
@pytest.mark.batch(1)
def test_a(spec_pair):
    pass
"""
    )
    result = pytester.runpytest("--strict-markers", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_a[[]code-ngram-b1[]]", "1 test collected*"])
    assert result.ret == 0


def test_matrix_ids_and_stacking(pytester: pytest.Pytester):
    pytester.makepyfile(
        HEADER
        + """
pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("code", "conversation"),
              pytest.mark.batch(1)]

@pytest.mark.drafter(Drafter("ngram", num_draft_tokens=4),
                     Drafter("draft_model", draft_model="tiny:dense-draft", id="draft"))
@pytest.mark.batch(4, 16)
def test_function_level_wins(spec_pair):
    pass

@pytest.mark.drafter("ngram")
class TestClassLevel:
    pytestmark = [pytest.mark.corpus("news")]

    def test_class_corpus(self, spec_pair):
        pass

@pytest.mark.model("tiny:dense", "tiny:moe")
@pytest.mark.drafter("ngram")
def test_two_models(spec_pair):
    pass
"""
    )
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(
        [
            "*test_function_level_wins[[]code-ngram-k4-b4[]]",
            "*test_function_level_wins[[]code-ngram-k4-b16[]]",
            "*test_function_level_wins[[]code-draft-b4[]]",
            "*test_function_level_wins[[]conversation-draft-b16[]]",
            "*TestClassLevel::test_class_corpus[[]news-ngram-b1[]]",
            "*test_two_models[[]dense-code-ngram-b1[]]",
            "*test_two_models[[]moe-conversation-ngram-b1[]]",
            "13 tests collected*",
        ]
    )


@pytest.mark.parametrize(
    ("markers", "expected"),
    [
        (
            '@pytest.mark.drafter("medusa")',
            "*test_bad: marker drafter value 'medusa': unknown drafter 'medusa'; expected one of "
            "ngram*",
        ),
        (
            '@pytest.mark.drafter("ngram")\n@pytest.mark.batch(0)',
            "*test_bad: marker batch value 0: expected a positive integer such as batch(1, 4, 16)",
        ),
        (
            '@pytest.mark.drafter("ngram")\n@pytest.mark.batch("8")',
            "*test_bad: marker batch value '8': expected a positive integer*",
        ),
        (
            '@pytest.mark.drafter(Drafter("ngram", window=3))',
            "*unknown setting(s) window; valid settings are num_draft_tokens*",
        ),
        (
            '@pytest.mark.drafter("ngram")\n@pytest.mark.corpus("poetry")',
            "*test_bad: marker corpus value 'poetry':*code*jsonl:PATH*",
        ),
        (
            '@pytest.mark.drafter("ngram")\n@pytest.mark.model("/no/such/model")',
            "*test_bad: marker model value '/no/such/model': no such model directory*",
        ),
        (
            '@pytest.mark.drafter("eagle3")',
            "*marker drafter value 'eagle3': Drafter('eagle3') needs draft_model=*",
        ),
        (
            '@pytest.mark.drafter(Drafter("eagle3", draft_model="/tmp"))',
            "*is not implemented by the reference engine; expected one of ngram, draft_model, "
            "block, none",
        ),
        (
            '@pytest.mark.drafter("ngram")\n@pytest.mark.generation(max_new_token=5)',
            "*marker generation got unknown keyword(s) max_new_token*",
        ),
        (
            '@pytest.mark.drafter("ngram")\n@pytest.mark.generation(temperature=0.7)',
            "*only greedy decoding (temperature=0) is measured*",
        ),
        (
            '@pytest.mark.drafter("ngram", "ngram")',
            "*several cases with id 'code-ngram-b1'; give each Drafter a distinct id=*",
        ),
        # A typo in a tolerance marker is found before anything measures, not after.
        (
            '@pytest.mark.drafter("ngram")\n@pytest.mark.tolerance(energy_per_tokn="5%")',
            "*test_bad: *energy_per_tokn*",
        ),
    ],
    ids=[
        "unknown-drafter",
        "batch-0",
        "batch-str",
        "unknown-kw",
        "no-corpus",
        "missing-path",
        "eagle3-without-model",
        "engine-lacks-drafter",
        "generation-kw",
        "sampling",
        "duplicate-id",
        "tolerance-typo",
    ],
)
def test_bad_marker_values_are_collection_errors(pytester: pytest.Pytester, markers, expected):
    default = []
    if "model(" not in markers:
        default.append('@pytest.mark.model("tiny:dense")')
    if "corpus(" not in markers:
        default.append('@pytest.mark.corpus("code")')
    if "batch(" not in markers:
        default.append("@pytest.mark.batch(1)")
    pytester.makepyfile(
        HEADER
        + "\n".join(default)
        + "\n"
        + markers
        + """
def test_bad(spec_pair):
    pass
"""
    )
    result = pytester.runpytest("--collect-only")
    result.stdout.fnmatch_lines([expected])
    result.stdout.no_fnmatch_line("*Traceback*")
    assert result.ret == pytest.ExitCode.INTERRUPTED


def test_missing_marker_is_named(pytester: pytest.Pytester):
    pytester.makepyfile(
        HEADER
        + """
@pytest.mark.model("tiny:dense")
@pytest.mark.batch(1)
def test_bad(spec_pair):
    pass
"""
    )
    result = pytester.runpytest("--collect-only")
    result.stdout.fnmatch_lines(["*test_bad: spec_pair needs a @pytest.mark.drafter(...) marker*"])


def test_bad_option_is_a_usage_error(pytester: pytest.Pytester):
    result = pytester.runpytest("--specenergy-repeats=0")
    result.stderr.fnmatch_lines(["*--specenergy-repeats: expected a positive integer, got '0'*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_help_texts_render(pytester: pytest.Pytester):
    result = pytester.runpytest("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*--specenergy-compare-fail=EXPR*", "*energy:5%*", "*--specenergy-dry-run*"]
    )


@pytest.mark.parametrize("command", ["report", "compare", "history", "merge", "predict", "doctor"])
def test_console_help_renders(command, capsys):
    from pytest_specenergy.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: specenergy" in capsys.readouterr().out
