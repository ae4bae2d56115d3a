"""The reporting layer of the benchmarks: ``BENCHMARKS.md`` (:mod:`.page`), the detail files (:mod:`.registry`) and
the plots (:mod:`.plots`), rendered from the JSON in ``benchmarks/results/`` (:mod:`.sources`) by :mod:`.publish`;
``python -m benchmarks report`` runs it. Nothing here measures."""
