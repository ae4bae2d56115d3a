"""Benchmarks of hf_hsap against the sequence-parallel schemes of the field, on the work of ``benchmarks/SPEC.md``.

Three layers, each a subpackage:

* :mod:`benchmarks.analytic`: pure (no clock, no processes): the spec's document lengths, every scheme's exact
  per-rank counts, the cost model, the placement bounds and search, and the figures, goals and summaries the suites
  and the pages share. The only part tests import for planner-side checks.
* :mod:`benchmarks.suites`: each suite measures, then writes its JSON under ``benchmarks/results/``; the worker
  functions of spawned ranks live here too. No suite imports :mod:`benchmarks.report`.
* :mod:`benchmarks.report`: the JSON in ``benchmarks/results/`` into ``BENCHMARKS.md``, the detail files
  ``benchmarks/results/*.md`` and the plots; it reads JSON only.

One entry point, ``python -m benchmarks <suite> [args]`` (:mod:`benchmarks.__main__`): it runs a suite, then renders
the pages again from the JSON; ``python -m benchmarks report`` renders them without measuring.
:mod:`benchmarks.tensor_memory` (the exact tensor peak of a block) is the instrument the suites and tests share.
"""
