"""The pure layer of the benchmarks (no clock, no processes): document lengths (:mod:`.distributions`), every scheme's
exact counts (:mod:`.schemes`, :mod:`.hsap_scheme`), traffic and window figures (:mod:`.traffic`, :mod:`.windows`),
the cost model and its predictions (:mod:`.cost_model`, :mod:`.predictions`), the placement sweep's layouts and
judgements (:mod:`.sweep`), its lower bounds (:mod:`.bound`, :mod:`.relaxation`) and offline search
(:mod:`.placement_search`), and what the suites and their pages share (:mod:`.peers`, :mod:`.memory`,
:mod:`.soak`)."""
