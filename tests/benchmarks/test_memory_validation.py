"""The memory model suite's validation on one CPU step each (``benchmarks/suites/memory_model.py``): the step's exact
tensor peak, measured, within 10 % of what hf_hsap's memory model predicts for it (float32, and bf16 with recomputed
norms, and in checkpoint blocks)."""
from benchmarks.suites.memory_model import BF16, BF16_ALL, DENSE, measure_step, predict_for


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


def test_one_measured_bf16_step_in_checkpoint_blocks_within_ten_percent():
    """Blocks of 2 layers: the recompute of a block (two layers' saved tensors) sets the peak."""
    sizes, levers = dict(BF16, num_hidden_layers=4), dict(BF16_ALL, recompute_norms=True, checkpoint_layers=2)
    measured = measure_step(sizes, 2048, levers, 1, "bf16")
    pred = predict_for(sizes, 2048, levers, 1, "bf16")
    step = pred.total - pred.weights - pred.states
    assert abs(step / measured["peak"] - 1) < 0.10, (step, measured)
