# ----------------------------------------------------------------------------- hf_hsap
def _plan(cu: np.ndarray, P: int, layers: Mapping, cfg: WindowConfig):
    """``(plan, source, ms)``: the plan of every kind (``source="planner"``), or without the ``windows``
    option when the planner has none (``source="derived"``)."""
    from hf_hsap.plan.planner import offline_link, plan_sequence

    from .traffic import planner_cost

    cost = planner_cost(SHAPE_KEY, offline_link(P, cfg.gpus_per_node), cfg.hardware)
    has_windows = "windows" in inspect.signature(plan_sequence).parameters
    t0 = time.perf_counter()
    if has_windows:
        plan = plan_sequence(cu, P, "auto", windows=dict(layers), cost=cost)
    else:  # a planner without windows: its full-attention placement, the windowed minimum computed here
        plan = plan_sequence(cu, P, "auto", cost=cost)
    return plan, "planner" if has_windows else "derived", (time.perf_counter() - t0) * 1e3


def evaluate_window_layout(model: str, dist: str, T: int, P: int, seed: int, cfg: WindowConfig) -> dict:
    """Every scheme on one layout, per layer kind of ``model``.

    Returns:
        ``{"model", "dist", "T", "P", "seed", "n_docs", "source", "plan_ms", "placement", "check",
        "kinds": {kind: {scheme: metrics}}, "split": {scheme: [P] split documents per rank},
        "layers": {kind: count}}`` (metrics: per-rank arrays, :func:`_metrics`).
    """
    layers = WINDOW_MODELS[model]["layers"]
    lengths = doc_lengths(dist, T, seed)
    cu = cu_seqlens(lengths)
    plan, source, ms = _plan(cu, P, layers, cfg)
    out = {"model": model, "dist": dist, "T": T, "P": P, "seed": seed, "n_docs": int(len(lengths)),
           "source": source, "plan_ms": ms, "placement": plan.placement_name, "check": 0.0, "kinds": {},
           "layers": {kind_key(w): int(n) for w, n in layers.items()}, "windows": {}}
    split = {"hsap": split_docs_per_part(plan.placement.doc, plan.placement.part, P)}
    for w in layers:
        k = kind_key(w)
        out["windows"][k] = w
        per = {n: _metrics(s) for n, s in all_schemes(lengths, P, LLAMA3_8B_SHAPE, cfg.gpus_per_node,
                                                      cfg.u_values, window=w).items() if n not in SKIP_SCHEMES}
        hs, diff = _hsap_kind(plan, source, w, lengths, cfg)
        out["kinds"][k] = {"hsap": _metrics(hs), **per}
        out["check"] = max(out["check"], diff)
    for name in out["kinds"][kind_key(next(iter(layers)))]:
        if name not in split:
            seg = scheme_segments(name, lengths, P)
            if seg is not None:
                split[name] = split_docs_per_part(seg[0], seg[1], P)
    out["split"] = split
    return out


def run_windows(cfg: WindowConfig | None = None, progress: bool = False) -> dict:
    """The whole section's numbers.

    Args:
        cfg: the grid (default :class:`WindowConfig`); progress: one line per (model, dist, T, P).

    Returns:
        ``{"rows", "goals", "config", "seconds"}`` (JSON-ready).
    """
    cfg = cfg or WindowConfig()
    t0 = time.perf_counter()
    layouts = []
    for model in cfg.models:
        for dist in cfg.dists:
            for T in cfg.Ts:
                for P in cfg.Ps:
                    t1 = time.perf_counter()
                    layouts += [evaluate_window_layout(model, dist, T, P, s, cfg) for s in cfg.seeds]
                    if progress:
                        ms = [lay["plan_ms"] for lay in layouts[-len(cfg.seeds):]]
                        print(f"  windows {model:8s} {dist:8s} T={T:7d} P={P:2d}: {time.perf_counter() - t1:5.1f}s "
                              f"(planning {np.median(ms):.0f} ms median)", flush=True)
    rows = summarize_windows(layouts)
    return {"rows": rows, "goals": window_goals(rows), "config": asdict(cfg), "seconds": time.perf_counter() - t0}
