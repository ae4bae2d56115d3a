"""The measuring layer of the benchmarks: each suite measures and writes its JSON under ``benchmarks/results/``
(:mod:`.output`), run by ``python -m benchmarks <suite>``; the worker functions of its spawned ranks live beside it
(``*_workers``). No module here imports :mod:`benchmarks.report`."""
