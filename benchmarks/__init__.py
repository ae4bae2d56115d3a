"""Benchmarks of hf_hsap against the sequence-parallel schemes of the field.

Pure modules (no ``torch.distributed``, no clock): :mod:`benchmarks.distributions` (document-length
distributions of ``shared/BENCHMARK_SPEC.md``), :mod:`benchmarks.schemes` (exact per-rank token, work
and traffic counts of every scheme) and :mod:`benchmarks.cost_model` (alpha-beta time / TGS model).
"""
