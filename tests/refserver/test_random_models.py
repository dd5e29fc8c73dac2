"""random:NAME: seeded random Qwen3 models of a registered shape, built in place, no download."""

from __future__ import annotations

import pytest

from pytest_specenergy.meters.modeled import pricing_for
from pytest_specenergy.meters.roofline import PRESETS
from pytest_specenergy.meters.shapes import get_shape
from pytest_specenergy.refserver.__main__ import build_parser
from pytest_specenergy.refserver.__main__ import main
from pytest_specenergy.refserver.engine import ReferenceEngine
from pytest_specenergy.refserver.random_models import build_random_model
from pytest_specenergy.refserver.random_models import parse_random_model
from pytest_specenergy.refserver.random_models import random_model_names
from pytest_specenergy.refserver.records import EngineConfig
from pytest_specenergy.refserver.tiny_models import priced_as_for
from pytest_specenergy.refserver.tokenizer import PaddedByteTokenizer

torch = pytest.importorskip("torch")

WIDE = "random:qwen3-4b:layers=1,vocab=1024"  # the 4B's layer widths, one layer: cheap on a CPU
SMALL = "random:qwen3-0.6b:layers=2,vocab=1024"
SMALL_DRAFT = "random:qwen3-0.6b:layers=1,vocab=1024"


def _matmul_params(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.ndim >= 2)


def test_every_dense_qwen3_shape_is_offered():
    assert random_model_names() == ["random:qwen3-0.6b", "random:qwen3-4b", "random:qwen3-8b"]
    spec = parse_random_model("random:qwen3-4b:layers=2,vocab=1024")
    assert (spec.layers, spec.vocab, spec.shape_key) == (2, 1024, "qwen3-4b")
    assert (
        spec.hidden,
        spec.mlp,
        spec.q_heads,
        spec.kv_heads,
        spec.head_dim,
        spec.tied_embeddings,
    ) == (
        2560,
        9728,
        32,
        8,
        128,
        True,
    )


def test_published_shapes_are_the_registry_s():
    """The server keeps its own copy of the published configs (it stands alone); they must be the
    plugin's registry entries they are priced as, and every dense Qwen3 shape must be offered."""
    from pytest_specenergy.meters.shapes import SHAPES
    from pytest_specenergy.refserver.random_models import PUBLISHED_SHAPES

    for key, dims in PUBLISHED_SHAPES.items():
        shape = get_shape(key)
        assert {k: getattr(shape, k) for k in dims} == dims, key
    dense = {
        k
        for k, s in SHAPES.items()
        if k.startswith("qwen3") and not s.is_moe and not s.linear_layers
    }
    assert dense == set(PUBLISHED_SHAPES)


@pytest.mark.parametrize("name", ["random:qwen3-4b", "random:qwen3-8b"])
def test_full_size_builds_on_the_target_device_in_the_target_dtype(name):
    """On the meta device nothing is allocated: a CPU float32 detour of 4-8B weights would show (and
    OOM)."""
    before = torch.get_default_dtype()
    model = build_random_model(parse_random_model(name), 0, torch.bfloat16, torch.device("meta"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == before  # the temporary default dtype is restored
    # exactly the registry shape
    assert _matmul_params(model) == get_shape(name.split(":", 1)[1]).num_params


def test_seed_decides_the_weights():
    spec = parse_random_model("random:qwen3-0.6b:layers=1,vocab=512,hidden=256,mlp=512")
    cpu = torch.device("cpu")
    rng = torch.get_rng_state()
    a, b, c = (
        build_random_model(spec, seed, torch.float32, cpu).state_dict() for seed in (3, 3, 4)
    )
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's RNG stream is left alone
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert not torch.equal(
        a["model.layers.0.mlp.up_proj.weight"], c["model.layers.0.mlp.up_proj.weight"]
    )


def test_loads_with_the_shape_and_reports_it(engine_for):
    engine = engine_for(model=WIDE)
    model = engine.target.model
    cfg = model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size) == (
        2560,
        9728,
        1,
        1024,
    )
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 8, 128)
    layer = model.model.layers[0]
    assert tuple(layer.self_attn.q_proj.weight.shape) == (32 * 128, 2560)
    assert tuple(layer.self_attn.k_proj.weight.shape) == (8 * 128, 2560)
    assert tuple(layer.mlp.up_proj.weight.shape) == (9728, 2560)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as Qwen3-4B
    # auto on a CPU
    assert engine.target.dtype == torch.float32 and engine.target.device.type == "cpu"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    info = engine.server_info()
    assert info["model_path"] == WIDE and info["dtype"] == "float32"
    shape = info["model_shape"]
    assert (
        shape["architecture"],
        shape["hidden_size"],
        shape["num_layers"],
        shape["vocab_size"],
    ) == (
        "Qwen3ForCausalLM",
        2560,
        1,
        1024,
    )
    assert info["priced_as"] == {"target": "qwen3-4b"}
    assert pricing_for(PRESETS["h200"], info).shape("target") == get_shape("qwen3-4b")


def test_priced_as_its_own_shape():
    assert priced_as_for("random:qwen3-4b", "random:qwen3-0.6b") == {
        "target": "qwen3-4b",
        "draft": "qwen3-0.6b",
    }
    assert priced_as_for("random:qwen3-8b:layers=2") == {"target": "qwen3-8b"}


@pytest.mark.parametrize(
    "spec",
    [
        {"drafter": "ngram", "num_draft_tokens": 3},
        {"drafter": "block", "block_size": 4, "draft_model": SMALL_DRAFT},
        {"drafter": "draft_model", "num_draft_tokens": 3, "draft_model": SMALL},
    ],
    ids=["ngram", "block", "self-draft"],
)
def test_speculation_is_exact(engine_for, make_requests, spec):
    # float64: random weights leave top-2 logit gaps a float32 verify pass could flip
    plain = engine_for(model=SMALL, dtype="float64")
    engine = engine_for(model=SMALL, dtype="float64", **spec)
    reqs = make_requests(plain, 3, 12)
    want = plain.generate(reqs)
    got = engine.generate(reqs)
    assert [r.output_ids for r in got] == [r.output_ids for r in want]
    assert all(r.spec.verify_ct > 0 for r in got)
    ids = [t for r in got for t in r.output_ids]
    text = engine.tokenizer.decode(ids)  # ids past the byte tokenizer decode to placeholders
    assert any(t >= 453 for t in ids) and all(f"<|unused_{t}|>" in text for t in ids if t >= 453)
    if spec["drafter"] != "ngram":
        info = engine.server_info()
        assert (
            info["draft_model_shape"]["num_layers"] == engine.draft.model.config.num_hidden_layers
        )
        assert info["priced_as"] == {"target": "qwen3-0.6b", "draft": "qwen3-0.6b"}


def test_padded_tokenizer():
    tok = PaddedByteTokenizer(1024)
    text = "Allegra, GPU energy"
    ids = tok.encode(text)
    assert max(ids) < 453 and tok.decode(ids) == text and tok.vocab_size == 1024
    assert tok.decode([*ids[:3], 999, *ids[3:]]) == tok.decode(
        ids[:3]
    ) + "<|unused_999|>" + tok.decode(ids[3:])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([1024])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("random:llama-7b", "random:qwen3-0.6b, random:qwen3-4b, random:qwen3-8b"),
        ("random:qwen3-30b-a3b", "the dense Qwen3 shapes"),
        ("random:qwen3.6-27b", "the dense Qwen3 shapes"),
        ("random:qwen3-4b:depth=2", "valid keys: layers, hidden, mlp, vocab"),
        ("random:qwen3-4b:layers=two", "must be a positive integer"),
        ("random:qwen3-4b:layers=0", "must be a positive integer"),
        ("random:qwen3-4b:layers", "must be key=value"),
        ("random:qwen3-4b:layers=1,layers=2", "given twice"),
        ("random:qwen3-4b:vocab=100", "smaller than the byte tokenizer's 453"),
    ],
)
def test_bad_names_are_clear(name, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=name)


def test_draft_vocabulary_must_match():
    with pytest.raises(ValueError, match="must share a tokenizer"):
        EngineConfig(
            model="random:qwen3-4b:vocab=1024", drafter="block", draft_model="random:qwen3-0.6b"
        )
    # a tiny target (vocabulary 453) and a random draft are caught once both are loaded
    with pytest.raises(ValueError, match=r"must share a tokenizer \(a random"):
        ReferenceEngine(EngineConfig(model="tiny:dense", drafter="block", draft_model=SMALL_DRAFT))


def test_cli(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--port", "0", "--model", "random:qwen3-4b:experts=8"])
    assert exc.value.code == 2
    assert "unknown override 'experts'" in capsys.readouterr().err.strip().splitlines()[-1]
    assert "random:qwen3-4b" in build_parser().format_help()
