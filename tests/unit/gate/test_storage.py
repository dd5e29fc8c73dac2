"""Run history, golden baselines and machine keys.

The storage checks are shown failing on bad files: a corrupted, truncated or foreign file is
reported with its path and the problem, and left byte for byte as it was; a crash mid-write
leaves the earlier history intact and no partial file behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import stat
import subprocess
import sys

import pytest

from pytest_specenergy import atomic
from pytest_specenergy.document import GOLDEN_KIND
from pytest_specenergy.document import RUN_KIND
from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.machine import machine_info
from pytest_specenergy.gate.machine import machine_key
from pytest_specenergy.gate.machine import slugify
from pytest_specenergy.gate.storage import GoldenStore
from pytest_specenergy.gate.storage import InvalidRunName
from pytest_specenergy.gate.storage import RunNotFound
from pytest_specenergy.gate.storage import RunStore
from pytest_specenergy.gate.storage import StorageError
from pytest_specenergy.gate.storage import load_run
from pytest_specenergy.gate.storage import storage_path
from pytest_specenergy.gate.storage import validate_run_name
from pytest_specenergy.meters.modeled import ModeledMeter

KEY = "modeled-h200-cpu-reference-0.1.0"
NOW = dt.datetime(2026, 5, 9, 14, 30, 0, tzinfo=dt.timezone.utc)
GARBAGE = b"\x00{not json at all\xff\n"
NODE = "tests/energy/test_drafters.py::test_drafter_pays_for_itself[code-eagle3-b16]"


ARM = {"source": "modeled (h200)", "samples": []}


def result(value: float = 1.0, case_id: str = "code-ngram-b4") -> dict:
    """A minimal case record: what the run document's reader needs, and one figure."""
    return {"case_id": case_id, "energy_per_token": value, "baseline": ARM, "speculative": ARM}


def document(value: float = 1.0, key: str | None = KEY, interrupted: bool = False) -> RunDocument:
    """A run document with one record, as a session builds it."""
    return RunDocument.from_dict(
        {
            "schema_version": 1,
            "plugin_version": "0.1.0",
            "datetime": "2026-05-09T14:30:00+00:00",
            "machine_info": {"node": "ci-7", "python": "3.11.7", "platform": "Linux"},
            "machine_key": key,
            "meters": {},
            "engine_starts": 2,
            "interrupted": interrupted,
            "results": [result(value)],
        }
    )


def save_run(doc, root, name=None, *, machine_key=KEY, now=NOW, interrupted=False):
    doc = dataclasses.replace(
        doc, machine_key=machine_key, interrupted=interrupted or doc.interrupted
    )
    return RunStore(root).save(doc, name, now=now)


def find_run(root, key, ref):
    return RunStore(root).find(key, ref)


def list_runs(root, key):
    return RunStore(root).list(key)


def snapshot(folder):
    """Every file under ``folder`` with its bytes."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# -- run history ----------------------------------------------------------------------------
def test_save_layout_counter_and_gitignore(tmp_path):
    storage = tmp_path / ".specenergy"
    first = save_run(document(), storage, "main", machine_key=KEY, now=NOW)
    second = save_run(document(), storage, machine_key=KEY, now=NOW)
    assert first == storage / KEY / "0001_main_20260509_143000.json"
    assert second.name == "0002_auto_20260509_143000.json"
    assert (storage / ".gitignore").read_text().splitlines()[-1] == "*"
    saved = load_run(first)
    assert (saved.kind, saved.schema_version, saved.name, saved.machine_key) == (
        RUN_KIND,
        1,
        "main",
        KEY,
    )
    assert saved.results == document().results
    assert [(r.counter, r.name) for r in list_runs(storage, KEY)] == [(1, "main"), (2, "auto")]


def test_gitignore_is_not_overwritten(tmp_path):
    (tmp_path / ".gitignore").write_text("mine\n")
    save_run(document(), tmp_path, machine_key=KEY, now=NOW)
    assert (tmp_path / ".gitignore").read_text() == "mine\n"


def test_machine_key_from_document(tmp_path):
    path = save_run(document(), tmp_path, machine_key="1xnvidia-h200-700w-nvml", now=NOW)
    assert path.parent.name == "1xnvidia-h200-700w-nvml"
    with pytest.raises(StorageError, match="not path-safe"):
        save_run(document(), tmp_path, machine_key="../escape", now=NOW)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "  ",
        "a/b",
        "a\\b",
        "c:d",
        "x*",
        "what?",
        "<a>",
        "p|q",
        'q"',
        "tab\tname",
        "last",
        "0003",
        ".hidden",
    ],
)
def test_bad_run_names_are_rejected(tmp_path, name):
    with pytest.raises(InvalidRunName) as info:
        save_run(document(), tmp_path, name, machine_key=KEY, now=NOW)
    assert "run name" in str(info.value) and (
        "expected" in str(info.value)
        or "pick another" in str(info.value)
        or "may not contain" in str(info.value)
    )
    assert not (tmp_path / KEY).exists() or not any((tmp_path / KEY).iterdir())


def test_run_name_as_argparse_type(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--specenergy-save", type=validate_run_name)
    assert parser.parse_args(["--specenergy-save=main"]).specenergy_save == "main"
    with pytest.raises(SystemExit):
        parser.parse_args(["--specenergy-save=feat/x"])
    assert "contains '/'" in capsys.readouterr().err


def test_find_run_references(tmp_path):
    a = save_run(document(1.0), tmp_path, "main", machine_key=KEY, now=NOW)
    b = save_run(document(2.0), tmp_path, "pr-7", machine_key=KEY, now=NOW)
    c = save_run(document(3.0), tmp_path, "main", machine_key=KEY, now=NOW)
    assert find_run(tmp_path, KEY, "last") == c
    assert find_run(tmp_path, KEY, "main") == c  # latest run saved under that name
    assert find_run(tmp_path, KEY, "pr-7") == b
    assert find_run(tmp_path, KEY, "0001") == a and find_run(tmp_path, KEY, "2") == b
    assert find_run(tmp_path, "other-key", str(a)) == a  # a path works from anywhere
    with pytest.raises(RunNotFound) as info:
        find_run(tmp_path, KEY, "release")
    assert "no run 'release'" in str(info.value) and "0001 (main)" in str(info.value)
    with pytest.raises(RunNotFound, match=r"runs exist for: modeled-h200"):
        find_run(tmp_path, "1xnvidia-h100-nvml", "last")
    with pytest.raises(RunNotFound, match="looks like a path"):
        find_run(tmp_path, KEY, str(tmp_path / "nope.json"))
    with pytest.raises(RunNotFound, match="empty compare reference"):
        find_run(tmp_path, KEY, " ")


@pytest.mark.parametrize(
    "content, fragment",
    [
        (GARBAGE, "not UTF-8 text"),
        (b"", "is empty - truncated or corrupted"),
        (
            json.dumps({"schema_version": 1, "kind": RUN_KIND, "results": [1, 2]}).encode()[:30],
            "is not valid JSON",
        ),
        (b"[1, 2, 3]", "top level is a JSON list"),
        (json.dumps({"benchmarks": [], "version": "4.0"}).encode(), "foreign schema"),
        (
            json.dumps({"schema_version": 99, "kind": RUN_KIND, "results": []}).encode(),
            "schema_version 99 is not supported",
        ),
        (
            json.dumps({"schema_version": 1, "kind": GOLDEN_KIND, "results": []}).encode(),
            "is a 'specenergy-golden' file, expected 'specenergy-run'",
        ),
        (json.dumps({"schema_version": 1, "kind": RUN_KIND}).encode(), "'results' is missing"),
        # Valid schema, bad records (fault-audit 3b, 3c): named, never a raw ValueError later.
        (
            json.dumps({"schema_version": 1, "kind": RUN_KIND, "results": [[1]]}).encode(),
            "results[0] is [1], expected a JSON object",
        ),
        (
            json.dumps(
                {
                    "schema_version": 1,
                    "kind": RUN_KIND,
                    "results": [{**result(case_id="c1"), "speculative": "fast"}],
                }
            ).encode(),
            "results[0] (c1).speculative is 'fast', expected a JSON object",
        ),
        (
            json.dumps(
                {
                    "schema_version": 1,
                    "kind": RUN_KIND,
                    "results": [
                        {
                            **result(case_id="c1"),
                            "speculative": {"samples": [{"decode_joules": "NaN?"}]},
                        }
                    ],
                }
            ).encode(),
            "results[0] (c1).speculative.samples[0]: 'decode_joules' is 'NaN?', expected a "
            "finite number or null",
        ),
        (
            json.dumps(
                {
                    "schema_version": 1,
                    "kind": RUN_KIND,
                    "results": [
                        {
                            **result(case_id="c1"),
                            "baseline": {
                                "samples": [
                                    {
                                        "decode_joules": 1,
                                        "decode_seconds": 1,
                                        "decode_tokens": 1,
                                        "tbt_ms": True,
                                    }
                                ]
                            },
                        }
                    ],
                }
            ).encode(),
            "baseline.samples[0]: 'tbt_ms' is True",
        ),
        (
            json.dumps(
                {
                    "schema_version": 1,
                    "kind": RUN_KIND,
                    "results": [
                        {
                            **result(case_id="c1"),
                            "speculative": {
                                "samples": [
                                    {
                                        "decode_joules": 1,
                                        "decode_seconds": 1,
                                        "decode_tokens": 1,
                                        "accept_lengths": ["2.0"],
                                    }
                                ]
                            },
                        }
                    ],
                }
            ).encode(),
            "speculative.samples[0]: 'accept_lengths' is ['2.0'], expected an array of finite "
            "numbers >= 0",
        ),
        (
            b'{"schema_version": 1, "kind": "specenergy-run", "results": [{"speedup": NaN, '
            b'"baseline": {}, "speculative": {}}]}',
            "'speedup' is nan, expected a finite number",
        ),
        (
            json.dumps(
                {
                    "schema_version": 1,
                    "kind": RUN_KIND,
                    "results": [{**result(case_id="c1"), "speculative": {"samples": {"0": {}}}}],
                }
            ).encode(),
            "speculative: 'samples' is {'0': {}}, expected a JSON array",
        ),
        (
            json.dumps(
                {
                    "schema_version": 1,
                    "kind": RUN_KIND,
                    "results": [{**result(case_id="c1"), "equivalence": {"exact_fraction": "all"}}],
                }
            ).encode(),
            "equivalence: 'exact_fraction' is 'all'",
        ),
        (
            json.dumps(
                {"schema_version": 1, "kind": RUN_KIND, "results": [{"case_id": "c1"}]}
            ).encode(),
            "results[0] (c1) lacks its 'baseline' arm",
        ),
    ],
)
def test_bad_run_files_are_reported_and_never_touched(tmp_path, content, fragment):
    save_run(document(), tmp_path, "main", machine_key=KEY, now=NOW)
    bad = tmp_path / KEY / "0002_main_20260509_143001.json"
    bad.write_bytes(content)
    with pytest.raises(StorageError) as info:
        load_run(find_run(tmp_path, KEY, "last"))  # "last" is the bad one: no silent fallback
    assert str(bad) in str(info.value) and fragment in str(info.value)
    # Saving more runs takes a new number; the bad file stays byte for byte.
    new = save_run(document(), tmp_path, "main", machine_key=KEY, now=NOW)
    assert new.name.startswith("0003_")
    assert bad.read_bytes() == content


def test_crash_in_serialisation_leaves_history_intact(tmp_path, monkeypatch):
    save_run(document(1.0), tmp_path, "main", machine_key=KEY, now=NOW)
    save_run(document(2.0), tmp_path, "main", machine_key=KEY, now=NOW)
    before = snapshot(tmp_path)

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash mid-write")

    monkeypatch.setattr(atomic.json, "dumps", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        save_run(document(3.0), tmp_path, "main", machine_key=KEY, now=NOW)
    monkeypatch.undo()
    assert snapshot(tmp_path) == before  # old files intact, nothing partial left
    assert load_run(find_run(tmp_path, KEY, "last")).results[0].energy_per_token == 2.0


def test_crash_after_partial_write_removes_the_temporary_file(tmp_path, monkeypatch):
    save_run(document(1.0), tmp_path, "main", machine_key=KEY, now=NOW)
    before = snapshot(tmp_path)

    def crash(src, dst):
        assert os.path.getsize(src) > 0  # the data was written, only the publish fails
        raise OSError("simulated power loss before the file got its name")

    monkeypatch.setattr(atomic.os, "link", crash)  # save_run publishes with link()
    monkeypatch.setattr(atomic.os, "replace", crash)  # write_json_atomic with replace()
    with pytest.raises(OSError, match="power loss"):
        save_run(document(2.0), tmp_path, "main", machine_key=KEY, now=NOW)
    with pytest.raises(OSError, match="power loss"):
        atomic.write_json_atomic(tmp_path / "run.json", {"x": 1})
    monkeypatch.undo()
    assert snapshot(tmp_path) == before


SAVER = r"""
import datetime as dt, os, sys, time
from pytest_specenergy.document import RunDocument
from pytest_specenergy.gate.storage import RunStore
storage, worker, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print("ready", flush=True)
while not os.path.exists(go):  # start together: the race needs the saves to overlap
    time.sleep(0.001)
now = dt.datetime(2026, 5, 9, 14, 30, 0, tzinfo=dt.timezone.utc)
for i in range(20):
    arm = {"source": "modeled (h200)", "samples": []}
    doc = RunDocument.from_dict({"machine_key": sys.argv[4], "results": [
        {"case_id": "c", "energy_per_token": worker * 1000.0 + i, "baseline": arm, "speculative": arm}]})
    print(RunStore(storage).save(doc, "race", now=now), flush=True)
"""


def test_concurrent_saves_with_one_name_in_one_second_all_survive(tmp_path):
    # Fault-audit 3e: 4 processes x 20 saves, same name, same second -> 34 files of 80, and
    # every caller told its save succeeded (check-then-replace).
    go = tmp_path / "go"
    savers = [
        subprocess.Popen(
            [sys.executable, "-c", SAVER, str(tmp_path), str(w), str(go), KEY],
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(4)
    ]
    for saver in savers:
        assert saver.stdout.readline().strip() == "ready"
    go.touch()
    returned = [
        line.strip() for saver in savers for line in saver.communicate(timeout=60)[0].splitlines()
    ]
    assert all(saver.returncode == 0 for saver in savers)
    runs = list_runs(tmp_path, KEY)
    assert len(returned) == len(set(returned)) == len(runs) == 80
    assert sorted(r.counter for r in runs) == list(range(1, 81))  # no counter taken twice
    values = {load_run(p).results[0].energy_per_token for p in returned}
    assert values == {float(w * 1000 + i) for w in range(4) for i in range(20)}
    assert not [p for p in (tmp_path / KEY).iterdir() if p.suffix == ".tmp"]


def test_an_existing_name_is_never_replaced(tmp_path, monkeypatch):
    first = save_run(document(1.0), tmp_path, "main", machine_key=KEY, now=NOW)
    # A saver that computed the same counter (no lock, e.g. another host) still cannot win.
    monkeypatch.setattr("pytest_specenergy.gate.storage._next_counter", lambda folder: 1)
    second = save_run(document(2.0), tmp_path, "main", machine_key=KEY, now=NOW)
    assert second.name.startswith("0002_")
    assert load_run(first).results[0].energy_per_token == 1.0


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_follow_the_umask_not_mkstemp(tmp_path, umask, mode):
    # Fault-audit 13: every file was 0600, unreadable to a CI artifact reader.
    old = os.umask(umask)
    try:
        saved = save_run(document(), tmp_path, "main", machine_key=KEY, now=NOW)
        report = tmp_path / "run.json"
        atomic.write_json_atomic(report, {"x": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(saved.stat().st_mode) == mode
    assert stat.S_IMODE(report.stat().st_mode) == mode


def test_replacing_a_file_keeps_its_mode(tmp_path):
    report = tmp_path / "report.html"
    report.write_text("old")
    report.chmod(0o640)
    atomic.write_text_atomic(report, "new")
    assert report.read_text() == "new" and stat.S_IMODE(report.stat().st_mode) == 0o640


def test_interrupted_runs_are_never_picked_as_baselines(tmp_path):
    done = save_run(document(1.0), tmp_path, "main", machine_key=KEY, now=NOW)
    cut = save_run(document(2.0), tmp_path, "main", machine_key=KEY, now=NOW, interrupted=True)
    assert load_run(cut).interrupted and not load_run(done).interrupted
    assert "interrupted" not in json.loads(done.read_text())
    assert find_run(tmp_path, KEY, "last") == done
    assert find_run(tmp_path, KEY, "main") == done
    with pytest.raises(RunNotFound, match=r"no finished run '0002'.*interrupted session"):
        find_run(tmp_path, KEY, "0002")
    assert find_run(tmp_path, KEY, str(cut)) == cut  # a PATH loads it; compare must refuse
    save_run(document(3.0), tmp_path, "pr-1", machine_key=KEY, now=NOW, interrupted=True)
    with pytest.raises(RunNotFound, match=r"no finished run 'pr-1'.*0003_pr-1"):
        find_run(tmp_path, KEY, "pr-1")


def test_storage_path_accepts_file_uri():
    assert storage_path("file://./.specenergy").as_posix() == ".specenergy"
    with pytest.raises(StorageError, match="only local directories"):
        storage_path("elasticsearch+http://host/index")


# -- golden baselines ------------------------------------------------------------------------
RECORD = CaseRecord.from_dict({**result(0.5, "code-eagle3-b16")})


def write_golden(goldens, nodeid, record, run_info=None):
    """A committed golden of ``nodeid``, as a session's flush leaves it (another store's ``used``)."""
    seed = GoldenStore(goldens.root)
    seed.update(KEY, nodeid, record, mode="new-only", mismatched=False, run_info=run_info)
    assert seed.flush()[1] == []


def test_golden_path_and_roundtrip(tmp_path):
    goldens = GoldenStore(tmp_path)
    path = goldens.path(KEY, NODE)
    assert path == (
        tmp_path
        / KEY
        / "tests/energy/test_drafters"
        / "test_drafter_pays_for_itself[code-eagle3-b16].json"
    )
    nested = goldens.path(KEY, "t/test_a.py::TestX::test_y[a/b:c]")
    assert nested.name == "TestX.test_y[a_b_c].json"
    assert goldens.load(KEY, NODE) is None
    write_golden(goldens, NODE, RECORD, {"machine_key": KEY})
    golden = goldens.load(KEY, NODE)
    assert (golden.record, golden.run_info, golden.path) == (RECORD, {"machine_key": KEY}, path)
    data = json.loads(path.read_text())
    assert (data["kind"], data["schema_version"], data["nodeid"]) == (GOLDEN_KIND, 1, NODE)


def test_colliding_node_ids_are_refused(tmp_path):
    goldens = GoldenStore(tmp_path)
    write_golden(goldens, "t/test_a.py::test_y[a/b]", RECORD)
    with pytest.raises(StorageError, match=r"holds the baseline of 't/test_a.py::test_y\[a/b\]'"):
        goldens.load(KEY, "t/test_a.py::test_y[a:b]")


@pytest.mark.parametrize("mode", ["check", "update", "regen-all", "new-only"])
def test_corrupt_golden_is_never_overwritten(tmp_path, mode):
    goldens = GoldenStore(tmp_path)
    path = goldens.path(KEY, NODE)
    path.parent.mkdir(parents=True)
    path.write_bytes(GARBAGE)
    with pytest.raises(StorageError) as info:
        goldens.update(KEY, NODE, RECORD, mode=mode, mismatched=True)
    assert str(path) in str(info.value)
    assert goldens.flush() == ([], [])
    assert path.read_bytes() == GARBAGE
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


@pytest.mark.parametrize(
    "mode, exists, mismatched, action, written, fails",
    [
        ("check", False, False, "created", True, True),  # pytest-regressions: fail on create
        ("update", False, False, "created", True, True),
        ("new-only", False, False, "created", True, False),
        ("regen-all", False, False, "created", True, False),
        ("check", True, True, "kept", False, False),  # the gate verdict fails the test
        ("new-only", True, True, "kept", False, False),
        ("update", True, True, "updated", True, True),  # rewrite, fail for review
        ("update", True, False, "unchanged", False, False),
        ("regen-all", True, False, "regenerated", True, False),  # rewrite everything, pass
        ("check", True, False, "unchanged", False, False),
    ],
)
def test_update_semantics(tmp_path, mode, exists, mismatched, action, written, fails):
    goldens = GoldenStore(tmp_path)
    old, new = CaseRecord.from_dict(result(1.0)), CaseRecord.from_dict(result(2.0))
    if exists:
        write_golden(goldens, NODE, old)
    update = goldens.update(KEY, NODE, new, mode=mode, mismatched=mismatched)
    assert (update.action, update.written, update.fails) == (action, written, fails)
    assert str(update.path) in update.message
    # The write is queued, never done while judging: the file changes only at flush.
    assert getattr(goldens.load(KEY, NODE), "record", None) == (old if exists else None)
    assert goldens.flush() == (([update.path] if written else []), [])
    assert goldens.load(KEY, NODE).record == (new if written else old)
    with pytest.raises(ValueError, match="expected one of check, update, regen-all, new-only"):
        goldens.update(KEY, NODE, new, mode="force", mismatched=False)


def test_a_golden_that_cannot_be_written_is_reported_at_flush(tmp_path):
    goldens = GoldenStore(tmp_path / "ro")
    goldens.update(KEY, NODE, RECORD, mode="check", mismatched=False)
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    try:
        written, failures = goldens.flush()
    finally:
        (tmp_path / "ro").chmod(0o700)
    if os.geteuid() == 0:  # root writes anywhere: the failure path needs another witness
        pytest.skip("running as root: a read-only folder is still writable")
    assert (
        written == [] and "cannot be written" in failures[0] and str(tmp_path / "ro") in failures[0]
    )


def test_unused_goldens(tmp_path):
    goldens = GoldenStore(tmp_path)
    used = "tests/test_a.py::test_x[b1]"
    for node in (used, "tests/test_a.py::test_x[b2]", "tests/test_gone.py::test_y"):
        write_golden(goldens, node, RECORD)
    goldens.update(KEY, used, RECORD, mode="check", mismatched=False)
    unused = goldens.unused([KEY])
    assert [p.relative_to(tmp_path / KEY).as_posix() for p in unused] == [
        "tests/test_a/test_x[b2].json",
        "tests/test_gone/test_y.json",
    ]
    assert goldens.unused(["missing-key"]) == []


def test_folders_without_run_files_are_not_machine_keys(tmp_path):
    # The engine logs' folder (.specenergy/logs) sits beside the history: it is no machine key.
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "engine-1.log").write_text("log")
    save_run(document(), tmp_path, "main")
    assert RunStore(tmp_path).machine_keys() == [KEY]


# -- machine key ----------------------------------------------------------------------------
def gpu_info(**gpu_changes):
    gpu = {
        "name": "NVIDIA H200",
        "power_limit_w": 700,
        "driver": "550.54.15",
        "uuid": "GPU-1234",
        "clocks": {"sm": 1980},
        "temperature": 41,
        **gpu_changes,
    }
    return {
        "node": "ci-7",
        "cpu": "AMD EPYC",
        "gpus": [gpu],
        "meter": {"kind": "nvml"},
        "engine": {"name": "sglang", "version": "0.5.9"},
    }


def test_machine_key_uses_stable_fields_only():
    key = machine_key(gpu_info())
    assert key == "1xnvidia-h200-700w-drv550.54.15-sglang-0.5.9-nvml"
    # Volatile readings and identities do not split the history.
    hot = gpu_info(clocks={"sm": 1410}, temperature=83, uuid="GPU-9999")
    assert machine_key({**hot, "node": "ci-12", "cpu": "Intel"}) == key
    assert machine_key(gpu_info(power_limit_w=700.2)) == key
    # Stable facts do.
    assert machine_key(gpu_info(power_limit_w=500)) != key
    assert machine_key(gpu_info(driver="560.1")) != key
    assert machine_key({**gpu_info(), "engine": {"name": "sglang", "version": "0.5.10"}}) != key
    two = {**gpu_info(), "gpus": gpu_info()["gpus"] * 2}
    assert machine_key(two).startswith("2xnvidia-h200-700w")
    assert machine_key(gpu_info(), fields=["gpu", "meter"]) == "1xnvidia-h200-nvml"
    with pytest.raises(ValueError, match="unknown machine-key field"):
        machine_key(gpu_info(), fields=["clocks"])


def test_modeled_machine_key_and_machine_info():
    info = machine_info(
        ModeledMeter("h200").describe(), engine={"name": "reference", "version": "0.1.0"}
    )
    assert {"system", "python", "cpu", "cpu_count", "meter", "engine"} <= set(info.as_dict())
    assert machine_key(info) == KEY
    # Host facts never enter a modeled key: any CPU runner shares one history.
    assert machine_key({**info.as_dict(), "cpu": "other", "node": "x"}) == KEY
    assert machine_key({**info.as_dict(), "meter": ModeledMeter("h100").describe()}) != KEY
    assert re.fullmatch(r"[a-z0-9.+-]+", slugify("NVIDIA H100 80GB HBM3 / PCIe"))
