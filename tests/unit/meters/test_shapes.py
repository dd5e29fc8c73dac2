"""Real model shapes: parameter counts, intensity, the paper's balance-point crossovers,
predictions."""

from __future__ import annotations

import pytest

from pytest_specenergy.meters.prediction import overhead_s
from pytest_specenergy.meters.prediction import predict
from pytest_specenergy.meters.prediction import price
from pytest_specenergy.meters.roofline import PRESETS
from pytest_specenergy.meters.shapes import SHAPES
from pytest_specenergy.meters.shapes import ModelShape
from pytest_specenergy.meters.shapes import expected_experts
from pytest_specenergy.meters.shapes import forward_cost
from pytest_specenergy.meters.shapes import get_shape
from pytest_specenergy.meters.shapes import verify_cost

QWEN3_4B = SHAPES["qwen3-4b"]
QWEN3_8B = SHAPES["qwen3-8b"]


@pytest.mark.parametrize(
    ("key", "params", "active"),
    [
        ("qwen3-0.6b", 0.596e9, 0.596e9),
        ("qwen3-4b", 4.02e9, 4.02e9),
        ("qwen3-8b", 8.19e9, 8.19e9),
        ("qwen3-30b-a3b", 30.5e9, 3.35e9),
        ("qwen3.6-27b", 26.9e9, 26.9e9),
        ("llama-3.1-8b", 8.03e9, 8.03e9),
    ],
)
def test_published_shapes_have_their_published_sizes(key, params, active):
    shape = SHAPES[key]
    assert shape.num_params == pytest.approx(params, rel=0.01)
    assert shape.active_params == pytest.approx(active, rel=0.01)


def test_qwen3_4b_is_the_shape_the_issue_names():
    s = QWEN3_4B
    assert (
        s.layers,
        s.hidden,
        s.mlp,
        s.q_heads,
        s.kv_heads,
        s.head_dim,
        s.vocab,
        s.dtype_bytes,
        s.tied_embeddings,
    ) == (36, 2560, 9728, 32, 8, 128, 151936, 2, True)
    assert s.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2


def test_hybrid_is_three_linear_layers_per_full_attention_layer():
    s = SHAPES["qwen3.6-27b"]
    assert s.layer_kinds[:4] == ("linear", "linear", "linear", "full")
    assert (s.linear_layers, s.full_layers) == (48, 16)
    # Only full-attention layers cache K/V; each linear layer keeps a fixed state per request.
    assert s.kv_bytes_per_token == 2 * 4 * 256 * 16 * 2
    assert s.state_bytes_per_row > 100e6


def test_unknown_shape_lists_the_known_ones():
    with pytest.raises(ValueError, match="qwen3-4b.*qwen3-8b"):
        get_shape("llama-9000")
    assert get_shape("Qwen3-8B") is QWEN3_8B


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="layer_pattern"):
        ModelShape("x", 2, 8, 8, 1, 1, 8, 10, layer_pattern=("mamba",))
    with pytest.raises(ValueError, match="MoE"):
        ModelShape("x", 2, 8, 0, 1, 1, 8, 10, experts=8, experts_per_token=0)


# --- the paper's s.9: where verification crosses the balance point ---------------------------
@pytest.mark.parametrize(
    ("verified", "gpu", "batch"),
    [
        (16, "h200", 16),  # DFlash-16 crosses H200's 163 FLOP/byte at batch 16
        (16, "h100", 32),  # ... and H100's 316 at 32
        (7, "h200", 32),  # DSpark-7 crosses H200 at 32
        (7, "h100", None),  # ... and stays below H100's up to batch 64
    ],
)
def test_crossover_batches_match_the_paper(verified, gpu, batch):
    # The first batch whose verify step is compute-bound: what predict's compute_bound flag says per
    # batch.
    assert (
        next((r.batch for r in predict(QWEN3_4B, verified, 260, gpu) if r.compute_bound), None)
        == batch
    )


def test_balance_points_are_the_papers():
    assert PRESETS["h100"].balance_point == pytest.approx(316)
    assert PRESETS["h200"].balance_point == pytest.approx(163)


def test_decode_is_far_below_the_balance_point_and_batching_moves_it():
    # Decode at single stream: ~1 FLOP/byte (2 FLOPs per bf16 weight of 2 bytes).
    assert verify_cost(QWEN3_8B, 1, 1, 260).intensity == pytest.approx(1.0, rel=0.05)
    # "About 10 operations per byte": a modest batch, an order of magnitude below either GPU.
    assert 5 < verify_cost(QWEN3_8B, 8, 1, 260).intensity < 163 / 10
    assert verify_cost(QWEN3_8B, 64, 1, 260).intensity < 163


def test_longer_contexts_lower_intensity():
    assert (
        verify_cost(QWEN3_4B, 16, 16, 2000).intensity < verify_cost(QWEN3_4B, 16, 16, 260).intensity
    )


def test_activations_are_what_keeps_dspark_below_h100_at_batch_64():
    cost = forward_cost(QWEN3_4B, 64, 7, 260, per_position_states=True)
    assert cost.intensity < 316
    assert cost.flops / (cost.weight_bytes + cost.kv_bytes) > 316


# --- calibration at real shapes ----------------------------------------------------------------
def test_qwen3_8b_decode_step_is_memory_bound_and_sanely_priced():
    cost = forward_cost(QWEN3_8B, 1, 1, 260)
    # bf16 layer weights + lm_head (the embedding table is read one row per token) + KV.
    assert cost.bytes == pytest.approx(
        2 * (6.95e9 + 0.622e9) + 261 * QWEN3_8B.kv_bytes_per_token, rel=0.01
    )
    h200 = price(cost, QWEN3_8B, PRESETS["h200"])
    h100 = price(cost, QWEN3_8B, PRESETS["h100"])
    assert not h200.compute_bound and not h100.compute_bound
    # 15.2 GB at the fitted bandwidth (4.23 TB/s, 2.18 TB/s) + the fitted 0.55 ms per step.
    assert 3.8e-3 < h200.seconds < 4.5e-3
    assert 7.0e-3 < h100.seconds < 8.0e-3
    # ML.ENERGY measured a Qwen3-8B step at batch 8 on H100 (the same weight read): 8.3 ms,
    # 3.55 J (benchmarks/mlenergy_calibration.py); single stream is priced close to it.
    assert 3.0 < h100.joules < 4.5 and 2.0 < h200.joules < 3.0
    # Board power while memory-bound: well above idle, below the 700 W limit.
    assert 400 < h200.joules / h200.seconds < 700
    assert 400 < h100.joules / h100.seconds < 700


def test_compute_bound_power_stays_under_the_board_limit():
    for gpu in PRESETS.values():
        cost = price(forward_cost(QWEN3_4B, 64, 16, 260), QWEN3_4B, gpu)
        assert cost.compute_bound
        assert cost.joules / cost.seconds == pytest.approx(gpu.power_limit_w)  # capped, slowed
        assert cost.seconds > cost.flops / gpu.peak_flops_per_s


def test_verify_of_k_plus_1_tokens_at_batch_1_costs_about_a_decode_step():
    gpu = PRESETS["h200"]
    decode = price(forward_cost(QWEN3_8B, 1, 1, 260), QWEN3_8B, gpu)
    verify = price(forward_cost(QWEN3_8B, 1, 5, 260, per_position_states=True), QWEN3_8B, gpu)
    assert not verify.compute_bound
    # Calibrated, compute time adds to memory time: 4 more tokens' math is ~2.5% of the step.
    assert verify.seconds == pytest.approx(decode.seconds, rel=0.03)
    assert verify.joules == pytest.approx(decode.joules, rel=0.05)


def test_step_overhead_with_and_without_cuda_graphs():
    gpu = PRESETS["h200"]
    # With graphs: the preset's fitted fixed step cost (ML.ENERGY's vLLM steps: ~0.55 ms).
    assert overhead_s(QWEN3_8B, gpu) == gpu.fixed_step_s
    assert 0.3e-3 < gpu.fixed_step_s < 0.8e-3
    # Eager: 36 layers x 10 kernels + 4 outside the layers, ~5 us each, on top.
    assert overhead_s(QWEN3_8B, gpu, cuda_graph=False) == pytest.approx(
        gpu.fixed_step_s + 364 * 5e-6
    )
    moe = SHAPES["qwen3-30b-a3b"]
    assert overhead_s(moe, gpu, cuda_graph=False) > overhead_s(QWEN3_8B, gpu, cuda_graph=False)


# --- MoE and hybrid work -----------------------------------------------------------------------
def test_experts_touched_grow_with_tokens_and_saturate():
    moe = SHAPES["qwen3-30b-a3b"]
    assert expected_experts(128, 8, 1) == pytest.approx(8)
    assert expected_experts(128, 8, 1000) == pytest.approx(128)
    one = forward_cost(moe, 1, 1, 260)
    verify = forward_cost(moe, 1, 8, 260, per_position_states=True)
    # A verify step of 8 tokens reads several times the expert weights of a 1-token decode step.
    assert verify.weight_bytes > 3 * one.weight_bytes
    given = forward_cost(moe, 1, 8, 260, [8.0] * moe.layers)  # every token routed alike
    assert given.weight_bytes == pytest.approx(one.weight_bytes, rel=0.01)


def test_hybrid_verify_writes_one_state_per_query_token():
    hybrid = SHAPES["qwen3.6-27b"]
    plain = forward_cost(hybrid, 4, 1, 260)
    verify = forward_cost(hybrid, 4, 16, 260, per_position_states=True)
    states = 4 * (1 + 16) * hybrid.state_bytes_per_row
    assert verify.kv_bytes == pytest.approx(states + 4 * (260 + 16) * hybrid.kv_bytes_per_token)
    assert plain.kv_bytes == pytest.approx(
        4 * 2 * hybrid.state_bytes_per_row + 4 * 261 * hybrid.kv_bytes_per_token
    )


def test_forward_cost_validates_row_lists():
    with pytest.raises(ValueError, match="2 rows"):
        forward_cost(QWEN3_8B, 2, [1], [10, 20])


@pytest.mark.parametrize("name", ["tiny:dense", "tiny:dense-draft", "tiny:moe", "tiny:hybrid"])
def test_tiny_shapes_agree_with_the_reference_servers_accounting(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pytest_specenergy.refserver.accounting import model_shape
    from pytest_specenergy.refserver.tiny_models import build_tiny_model

    accounting = model_shape(build_tiny_model(name))
    shape = SHAPES[name]
    query, context = [5, 5, 1], [40, 50, 60]
    touched = [12] * shape.layers if shape.is_moe else None
    theirs = accounting.step_cost(
        query,
        context,
        logit_rows=11,
        distinct_tokens=11,
        experts_touched=touched,
        per_position_states=True,
    )
    ours = forward_cost(shape, 3, query, context, touched, per_position_states=True)
    assert ours.flops == pytest.approx(theirs.flops, rel=1e-9)
    # norm scales left out
    assert ours.weight_bytes == pytest.approx(theirs.weight_bytes, rel=0.002)
    # The server keeps `kernel` conv columns, SGLang (and this model) `kernel - 1`.
    assert ours.kv_bytes == pytest.approx(
        theirs.kv_bytes, rel=0.05 if shape.linear_layers else 1e-9
    )


# --- predictions -------------------------------------------------------------------------------
def test_predicted_savings_shrink_with_batch_and_end_past_the_balance_point():
    rows = predict(QWEN3_4B, 16, 260, "h200", accept_length=3.0)
    savings = [r.saving for r in rows]
    assert savings == sorted(savings, reverse=True)
    by_batch = {r.batch: r for r in rows}
    assert by_batch[1].saving > 0.5 and not by_batch[1].compute_bound
    assert by_batch[8].saving > 0 and by_batch[32].saving < 0 and by_batch[32].compute_bound
    # DSpark-7 still saves at batch 64 on H100, below the balance point (paper s.9).
    last = predict(QWEN3_4B, 7, 260, "h100", accept_length=3.0)[-1]
    assert last.batch == 64 and not last.compute_bound and last.saving > 0


def test_break_even_accept_length_is_where_the_saving_is_zero():
    row = predict(QWEN3_4B, 16, 260, "h100", batches=[16])[0]
    assert row.saving is None and row.spec_joules_per_token is None
    again = predict(
        QWEN3_4B, 16, 260, "h100", accept_length=row.break_even_accept_length, batches=[16]
    )[0]
    assert again.saving == pytest.approx(0.0, abs=1e-9)


def test_draft_cost_lowers_the_saving():
    plain = predict(QWEN3_8B, 5, 260, "h200", 3.0, [1])[0]
    drafted = predict(
        QWEN3_8B,
        5,
        260,
        "h200",
        3.0,
        [1],
        draft_shape=SHAPES["qwen3-0.6b"],
        draft_passes=4,
        draft_tokens=1,
    )[0]
    fraction = predict(QWEN3_8B, 5, 260, "h200", 3.0, [1], draft_cost=0.3)[0]
    assert plain.saving > drafted.saving > 0
    assert drafted.break_even_accept_length > plain.break_even_accept_length
    assert fraction.break_even_accept_length == pytest.approx(plain.break_even_accept_length + 0.3)


def test_prediction_rejects_impossible_accept_lengths():
    with pytest.raises(ValueError, match="accept length"):
        predict(QWEN3_4B, 7, 260, "h200", accept_length=8)
    with pytest.raises(ValueError, match="h100, h200"):
        predict(QWEN3_4B, 7, 260, "a100")
