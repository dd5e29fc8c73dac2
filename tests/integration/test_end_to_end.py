"""End to end against the real reference server: markers -> ids -> servers -> table and JSON."""

from __future__ import annotations

import json

import pytest

MODULE_A = """
import pytest
from pytest_specenergy import Drafter

# A pool of 12: three per request in flight at batch 4 (twice was marginal on a loaded 2-core machine).
pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.generation(max_new_tokens=24, prompts=12)]

@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(1, 4)
def test_ngram(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent()
    assert r.accept_length is not None and r.accept_length >= 1.0
"""

MODULE_B = """
import pytest
from pytest_specenergy import Drafter

# A pool of 12: three per request in flight at batch 4 (twice was marginal on a loaded 2-core machine).
pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.generation(max_new_tokens=24, prompts=12)]

@pytest.mark.corpus("code")
@pytest.mark.drafter(Drafter("draft_model", draft_model="tiny:dense-draft", num_draft_tokens=3, id="draft"),
                     "ngram")
@pytest.mark.batch(4)
def test_other_module(spec_pair):
    r = spec_pair.measure()
    r.assert_equivalent()
"""


def test_engines_start_once_across_modules_and_results_reach_table_and_json(
    pytester: pytest.Pytester, run_suite
):
    pytester.makepyfile(test_a=MODULE_A, test_b=MODULE_B)
    out = pytester.path / "run.json"
    result = run_suite(f"--specenergy-json={out}", repeats=2)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*= specenergy =*",
            # The source once, in the header line; verdict (none: nothing gated) and saving first.
            "energy figures: modeled (h200, priced as Qwen3-8B); 4 results of 3 distinct pairs, "
            "3 engine starts; prompt pool per case: 12",
            "saving*test*base J/tok*spec J/tok*accept len*speedup*exact*flags",
            "*test_ngram[[]code-ngram-b1[]]*",
            "*test_ngram[[]code-ngram-b4[]]*",
            "*test_other_module[[]code-draft-b4[]]*",
            "*test_other_module[[]code-ngram-b4[]]*",
            "(-v shows every column: *)",
        ]
    )
    table = result.stdout.str().split("energy figures:")[1].split("(-v shows")[0].splitlines()[1:]
    assert "priced as" not in "\n".join(table) and max(map(len, table)) <= 120
    data = json.loads(out.read_text())
    assert data["engine_starts"] == 3  # baseline twin, ngram, draft_model: once each
    assert data["meters"]["modeled:h200"]["balance_point_flop_per_byte"] == 163.0
    assert len(data["results"]) == 4
    assert data["machine_key"] == data["results"][0]["machine_key"]
    by_id = {r["case_id"]: r for r in data["results"]}
    assert set(by_id) == {"code-ngram-b1", "code-ngram-b4", "code-draft-b4"}
    ngram4, draft4 = by_id["code-ngram-b4"], by_id["code-draft-b4"]
    # One baseline arm of (model, batch 4, code) serves both drafters.
    assert ngram4["baseline"]["samples"] == draft4["baseline"]["samples"]
    for record in data["results"]:
        for arm in ("baseline", "speculative"):
            assert len(record[arm]["samples"]) == 2
            assert record[arm]["source"].startswith("modeled (h200, priced as ")
            assert all(
                s["decode_joules"] > 0 and s["decode_tokens"] > 0 for s in record[arm]["samples"]
            )
        assert record["speculative"]["engine"]["config"]["drafter"] is not None
        assert record["baseline"]["engine"]["config"]["drafter"] is None
        assert record["equivalence"]["exact_fraction"] == 1.0
    assert by_id["code-ngram-b4"]["speculative"]["concurrency"]["max_running"] == 4


def test_failing_assertion_shows_the_numbers(pytester: pytest.Pytester, run_suite):
    pytester.makepyfile("""
import pytest

@pytest.mark.model("tiny:dense")
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(1)
@pytest.mark.generation(max_new_tokens=16)
def test_unreachable_acceptance(spec_pair):
    spec_pair.measure().assert_acceptance(at_least=50)
""")
    result = run_suite("-v", repeats=2)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            # Progress: each engine start (what, how long), and at -v each arm's repeats.
            "specenergy: engine reference:tiny:dense[[]*[]] started in * s",
            "specenergy: code-ngram-b1 baseline repeat 1/2 (* s)",
            "specenergy: code-ngram-b1 speculative repeat 2/2 (* s)",
            # The failure: the user's line and the message, none of the plugin's frames.
            ">*spec_pair.measure().assert_acceptance(at_least=50)",
            "*SpecEnergyAssertionError: accept length * is below the required 50.000",
            "*case code-ngram-b1 [[]modeled (h200, priced as Qwen3-8B)[]]",
            "*baseline: * J/token, tbt * ms (2 repeats: *",
            "*speculative: * J/token, tbt * ms (2 repeats: *",
        ]
    )
    failure = result.stdout.str().split("= FAILURES =")[1].split("short test summary")[0]
    assert "pytest_specenergy/" not in failure and "def _fail" not in failure, failure


def test_engine_that_cannot_start_fails_the_case_with_its_log(pytester: pytest.Pytester, run_suite):
    pytester.mkdir("not_a_checkpoint")
    pytester.makepyfile("""
import pytest

@pytest.mark.model("not_a_checkpoint")
@pytest.mark.corpus("code")
@pytest.mark.drafter("ngram")
@pytest.mark.batch(1, 2)
def test_broken_model(spec_pair):
    spec_pair.measure()
""")
    result = run_suite(repeats=2)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["*EngineStartError: engine reference:not_a_checkpoint*exited with code*log *"]
    )
    # Both arms' engines start side by side, and each failed config is started once: the
    # second case fails fast with the same error.
    logs = sorted(
        log.name.split("-", 2)[2].rsplit("-", 1)[0]
        for log in (pytester.path / ".specenergy" / "logs").glob("*.log")
    )
    assert logs == ["reference_not_a_checkpoint_baseline_", "reference_not_a_checkpoint_ngram_"]
