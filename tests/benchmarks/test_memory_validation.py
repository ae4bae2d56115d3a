"""The memory model suite's validation on one CPU step each (``benchmarks/suites/memory_model.py``): the step's exact
tensor peak, measured, within 10 % of what hf_hsap's memory model predicts for it (float32, and bf16 with recomputed
norms, tiled attention, and in checkpoint blocks)."""
from benchmarks.suites.memory_model import BF16, BF16_ALL, DENSE, WIDE, measure_step, predict_for


def test_one_measured_cpu_step_within_ten_percent():
    sizes = dict(DENSE, vocab_size=8192, intermediate_size=1024)
    levers = dict(loss_tile_tokens=256)
    measured = measure_step(sizes, 1536, levers)
    pred = predict_for(sizes, 1536, levers, 1)
    step = pred.total - pred.weights - pred.states
    assert abs(step / measured["peak"] - 1) < 0.10, (step, measured)


def test_one_measured_bf16_step_with_recomputed_norms_within_ten_percent():
    levers = dict(BF16_ALL, recompute_norms=True)  # 8K tokens: the attention's backward sets the peak
    measured = measure_step(BF16, 8192, levers, 1, "bf16")
    pred = predict_for(BF16, 8192, levers, 1, "bf16")
    step = pred.total - pred.weights - pred.states
    assert abs(step / measured["peak"] - 1) < 0.10, (step, measured)


def test_tiled_attention_lowers_the_measured_peak_as_modelled():
    """SP 1, more query heads than the hidden size (the attention's backward sets the peak): tiles of 256 queries
    lower the exact peak, and the model's prediction stays within 10 % of it."""
    sizes = dict(WIDE, vocab_size=2048, num_attention_heads=16)
    levers = dict(BF16_ALL, recompute_norms=True)
    tiled = dict(levers, tiled_attention=True, attention_tile_tokens=256)
    off, on = (measure_step(sizes, 2048, lev, 1, "bf16")["peak"] for lev in (levers, tiled))
    pred = predict_for(sizes, 2048, tiled, 1, "bf16")
    assert on < off
    assert abs((pred.total - pred.weights - pred.states) / on - 1) < 0.10, (pred, on)


def test_one_measured_bf16_step_in_checkpoint_blocks_within_ten_percent():
    """Blocks of 2 layers: the recompute of a block (two layers' saved tensors) sets the peak."""
    sizes, levers = dict(BF16, num_hidden_layers=4), dict(BF16_ALL, recompute_norms=True, checkpoint_layers=2)
    measured = measure_step(sizes, 2048, levers, 1, "bf16")
    pred = predict_for(sizes, 2048, levers, 1, "bf16")
    step = pred.total - pred.weights - pred.states
    assert abs(step / measured["peak"] - 1) < 0.10, (step, measured)
