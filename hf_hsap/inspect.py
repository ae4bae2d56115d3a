"""``hsap-plan``: look at the plan hf_hsap makes for a packed row.

Given document lengths (or a distribution of the benchmark spec), the row length ``T``, the SP size
``P`` and the Ulysses size ``U``, it prints the placement summary and every rank's tokens, attention work
and received KV (and all-to-all tokens for ``U > 1``) and the cost model's estimated step time of every
rank relative to the mean (what ``placement="auto"`` evens out), and can write a PNG with a token → rank map and
a rank × rank map of the KV traffic::

    hsap-plan --dist longtail --seed 0 --T 131072 --P 8 --png plan.png
    hsap-plan --lengths 100,2000,30000,500 --P 4 --U 2
    hsap-plan --dist mixed --P 8 --gpus_per_node 8 --config ./my-model/config.json --hardware H100

Every printed figure is taken from :meth:`hf_hsap.Plan.stats`. matplotlib is imported only for ``--png``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from .config import HSAPConfig
from .data.lengths import DISTRIBUTIONS, doc_lengths
from .memory.advice import LEVER_ORDER, MEMORY_MODELS, levers_from_names, max_length_lines
from .memory.host import DEFAULT_HOST_MEMORY_GIB, DEFAULT_PROCESS_FOOTPRINT_GIB, HOST_RESERVE_FRACTION, OFFLOADS
from .model_shape import MODEL_SHAPES
from .plan.cost import HARDWARE_LINKS, CostModel
from .plan.placement import PLACEMENTS
from .plan.planner import Plan, choose_ulysses_size, offline_link, plan_sequence
from .config import attention_windows

DISTS = DISTRIBUTIONS
_L3 = MODEL_SHAPES["llama3-8b"]  # the default model of --config: the one table's Llama-3-8B
LLAMA3_8B = SimpleNamespace(num_attention_heads=_L3.q_heads, num_key_value_heads=_L3.kv_heads, hidden_size=_L3.hidden,
                            intermediate_size=_L3.intermediate)
# The benchmark spec's sampler (one implementation: hf_hsap.data.lengths, also benchmarks.analytic.distributions):
# ``[n_docs]`` int64 lengths of one row of ``T`` tokens, for ``--dist``.
sample_lengths = doc_lengths


def _parse_lengths(text: str) -> np.ndarray:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"--lengths takes comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError("--lengths needs at least one document and every length must be >= 1")
    return np.array(vals, dtype=np.int64)


def rank_owner(plan: Plan) -> np.ndarray:
    """SP rank that holds every global token. Shapes: ``-> [T]`` int64."""
    owner = np.empty(plan.total_tokens, dtype=np.int64)
    for r in range(plan.size):
        owner[plan.local_token_indices(r).numpy()] = r
    return owner


def summary_lines(plan: Plan) -> list[str]:
    """The printed report: placement summary and one line per rank (numbers from ``plan.stats()``).

    Args:
        plan: an offline plan.

    Returns:
        Lines of text.
    """
    st = plan.stats()
    lengths = plan.layout.doc_lengths
    T, P, U = plan.total_tokens, plan.size, plan.ulysses_size
    pl = plan.placement
    parts_per_doc = np.bincount(np.unique(pl.doc * pl.n_parts + pl.part) // pl.n_parts, minlength=len(lengths))
    split = parts_per_doc > 1
    tok = np.array(st.tokens, dtype=np.float64)
    work = np.array(st.attn_work, dtype=np.float64)
    recv = np.array(st.recv_kv_tokens, dtype=np.float64)
    ring = (P - 1) / P * T if P > 1 else 1.0
    lines = [
        f"layout: {len(lengths)} documents, T = {T}, longest {int(lengths.max())}, median {int(np.median(lengths))}",
        f"group: P = {P} ranks = U {U} (all-to-all) x R {plan.n_parts} (point-to-point)",
        f"placement: {st.placement}; {int(split.sum())} document(s) split "
        f"(over up to {int(parts_per_doc.max())} parts), {int((~split).sum())} whole; "
        f"rounds {st.rounds} ({st.round_order})",
        f"balance: tokens max/mean {tok.max() / tok.mean():.3f}, "
        f"work max/mean {work.max() / max(work.mean(), 1e-30):.3f}",
        f"received KV per layer: max {int(recv.max())} ({recv.max() / ring:.3f} of ring's (P-1)/P*T), "
        f"mean {recv.mean():.1f} ({recv.mean() / ring:.3f}), total {int(recv.sum() / max(U, 1))}",
    ]
    if len(st.kinds) > 1 or plan.windows != (None,):
        lines.append("mask kinds (the table below is the first):")
        for name, k in st.kinds.items():
            kw, kr = np.array(k.attn_work, dtype=np.float64), np.array(k.recv_kv_tokens, dtype=np.float64)
            lines.append(f"  {name}: {k.layers} layer(s), work max/mean {kw.max() / max(kw.mean(), 1e-30):.3f}, "
                         f"received KV max {int(kr.max())} mean {kr.mean():.1f}, rounds {k.rounds} ({k.round_order})")
    est = np.array(st.est_time, dtype=np.float64)
    if est.size:
        c = plan.cost
        a2a = " (incl. all-to-all)" if U > 1 else ""
        lines.append(f"cost model (attention pairs): token {c.token_cost:.0f}{a2a}, KV token {c.kv_token_cost:.0f}, "
                     f"round {c.round_cost:.0f}; estimated step time max/mean {est.max() / est.mean():.3f} "
                     "(placement=auto keeps the candidate with the lowest max)")
    lines.append("")
    head = f"{'rank':>4} {'part':>4} {'tokens':>9} {'attn_work':>15} {'recv_kv':>9} {'send_kv':>9}"
    head += f" {'a2a':>9}" if U > 1 else ""
    head += f" {'est/mean':>8}" if est.size else ""
    lines.append(head)
    for r in range(P):
        w = st.attn_work[r]
        w_txt = f"{w:15.1f}" if isinstance(w, float) and not float(w).is_integer() else f"{int(w):15d}"
        line = (f"{r:4d} {r // U:4d} {st.tokens[r]:9d} {w_txt} {st.recv_kv_tokens[r]:9d} "
                f"{st.send_kv_tokens[r]:9d}")
        line += f" {st.a2a_tokens[r]:9d}" if U > 1 else ""
        line += f" {est[r] / est.mean():8.3f}" if est.size else ""
        lines.append(line)
    return lines


def write_png(plan: Plan, path: str, title: str = "") -> None:
    """Token → rank map (left) and the part × part KV traffic (right) as a PNG.

    Args:
        plan: an offline plan; path: output file; title: figure title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    owner = rank_owner(plan)
    T = owner.shape[0]
    cols = max(1, int(math.ceil(math.sqrt(T * 4))))  # a 1:4 (rows:cols) picture of the token line
    rows = int(math.ceil(T / cols))
    img = np.full(rows * cols, np.nan)
    img[:T] = owner
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2.2, 1]})
    cmap = plt.get_cmap("tab20" if plan.size <= 20 else "viridis", plan.size)
    im = a0.imshow(img.reshape(rows, cols), aspect="auto", cmap=cmap, interpolation="nearest",
                   vmin=-0.5, vmax=plan.size - 0.5)
    a0.set_title(f"token → rank (row-major, {cols} tokens per line)")
    a0.set_xlabel("token offset in line")
    a0.set_ylabel("line")
    cu = plan.layout.cu_seqlens[1:-1]
    if cu.shape[0] <= 400:  # document boundaries
        a0.scatter(cu % cols, cu // cols, s=4, c="black", marker="|")
    fig.colorbar(im, ax=a0, label="SP rank")
    m = np.array(plan.stats().send_kv_pairs, dtype=np.float64)
    h = a1.imshow(m, cmap="magma_r")
    a1.set_title("KV tokens sent, part → part (forward)")
    a1.set_xlabel("receiving part")
    a1.set_ylabel("sending part")
    fig.colorbar(h, ax=a1, label="KV tokens")
    fig.suptitle(title or f"{plan.placement_name}: T={T}, P={plan.size}, U={plan.ulysses_size}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of ``hsap-plan``."""
    p = argparse.ArgumentParser(prog="hsap-plan", description="Show the plan hf_hsap makes for a packed row.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--lengths", help="comma-separated document lengths (e.g. 100,2000,30000)")
    src.add_argument("--dist", choices=DISTS, help="draw lengths from a benchmark-spec distribution")
    p.add_argument("--seed", type=int, default=0, help="seed of --dist (default 0)")
    p.add_argument("--T", type=int, default=None,
                   help="row length: the sum of --lengths (checked) or the length to draw (default 131072)")
    p.add_argument("--P", type=int, default=8, help="SP size (default 8)")
    p.add_argument("--U", type=_degree, default=1,
                   help="Ulysses (all-to-all) size inside the SP group (default 1), or per_batch: the degree "
                        "ulysses_size='per_batch' would run this row at (every one dividing --P, the heads of "
                        "--config, default Llama-3-8B's 32, and --gpus_per_node), with every degree's estimate")
    p.add_argument("--placement", choices=PLACEMENTS, default="auto")
    p.add_argument("--budget", type=int, default=None, help="recv_budget_tokens (default: none)")
    p.add_argument("--rounds", choices=["auto", "batched", "by_peer"], default="auto",
                   help="round order of the transfers (default auto)")
    p.add_argument("--gpus_per_node", "--gpus-per-node", type=int, default=None,
                   help="GPUs per node: a group inside one node plans with NVLink costs (default: network costs); "
                        "with --max-length, the processes sharing one node's host memory (default: min(--gpus, 8))")
    p.add_argument("--config", help="a model's config.json (or its folder): price tokens and KV for that model "
                   "(default: Llama-3-8B shapes)")
    p.add_argument("--hardware", choices=sorted(HARDWARE_LINKS), default=None,
                   help="GPU of the cost model (default A100)")
    p.add_argument("--attention-only", action="store_true",
                   help="plan for a step of attention alone: no linear layers, so a token costs only its "
                        "communication (KV, and with --U > 1 its all-to-all share)")
    p.add_argument("--windows", default=None,
                   help="the layers' attention masks: comma-separated WINDOW[:LAYERS] or full[:LAYERS] "
                        "(e.g. 1024:5,full:1 for Gemma 3; 4096 for a Mistral-style window on every layer); "
                        "default: read from --config, else full attention")
    p.add_argument("--png", help="write the token map and traffic heat map to this PNG")
    fit = p.add_argument_group("the longest row that fits (--max-length)")
    fit.add_argument("--max-length", action="store_true",
                     help="print the longest packed row whose training step fits each GPU (hf_hsap.memory's model)")
    fit.add_argument("--model", default="llama-3-8b", choices=sorted(MEMORY_MODELS),
                     help="a model's shapes (default llama-3-8b); --config overrides it")
    fit.add_argument("--gpus", type=int, default=8, help="GPUs in all (default 8); one row spans --sp of them")
    fit.add_argument("--sp", type=int, default=None, help="GPUs one row is sharded over (default: --gpus)")
    fit.add_argument("--gpu-memory", type=float, default=80.0, help="GiB of memory per GPU (default 80)")
    fit.add_argument("--levers", default="all",
                     help=f"all (default), none, or comma-separated: {', '.join(LEVER_ORDER)}")
    fit.add_argument("--checkpoint-layers", type=int, default=1,
                     help="decoder layers per checkpoint with gradient_checkpointing (default 1)")
    fit.add_argument("--layers-kept-on-device", type=int, default=0,
                     help="with activation_offloading, the last this many layers' checkpoints stay on the GPU "
                          "(default 0)")
    fit.add_argument("--offload", choices=list(OFFLOADS), default="none",
                     help="none (default); optimizer: DeepSpeed ZeRO-3 offload_optimizer (master weights, AdamW "
                          "moments and gradient partitions in host memory, the step on the CPU; --sharding zero3); "
                          "params: the parameters too, gathered layer by layer (ZeRO-3 offload_param, or FSDP2's "
                          "CPUOffloadPolicy with --sharding fsdp2, which offloads both)")
    fit.add_argument("--host-memory", type=float, default=DEFAULT_HOST_MEMORY_GIB,
                     help=f"GiB of host memory per node (default {DEFAULT_HOST_MEMORY_GIB:g}: a DGX-H100 node's 2 TB), "
                          f"less {HOST_RESERVE_FRACTION * 100:.0f}%% kept for the OS; 0: the host not counted")
    fit.add_argument("--host-footprint", type=float, default=DEFAULT_PROCESS_FOOTPRINT_GIB,
                     help="GiB of host memory each GPU process uses beside its tensors (Python, torch, CUDA runtime, "
                          f"NCCL, data loader; default {DEFAULT_PROCESS_FOOTPRINT_GIB:g})")
    fit.add_argument("--pinned-round-limit-mb", type=float, default=None,
                     help="pinned host buffers (offloaded activations, DeepSpeed's gradient buffers, FSDP2's shards) "
                          "larger than this many MiB are not rounded up to a power of two: PYTORCH_ALLOC_CONF="
                          "pinned_max_round_threshold_mb:N,pinned_max_cached_size_mb:N (both: unrounded blocks "
                          "must not be cached), or 0 for DeepSpeed's DS_PIN_MEMORY_BACKEND=native "
                          "(default: torch's, every pinned buffer rounded)")
    fit.add_argument("--sharding", choices=["ddp", "fsdp2", "zero3"], default="zero3",
                     help="how weights, gradients and optimizer states are held (default zero3)")
    return p


def _degree(value: str) -> int | str:
    """``--U``: a positive int or ``per_batch``."""
    if value == "per_batch":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'per_batch', got {value!r}") from None


def _load_config(path: str) -> SimpleNamespace:
    """A model config from a local ``config.json`` (or the folder holding one), as attributes; a
    multimodal config's ``text_config`` is used when present. No hub access."""
    f = Path(path)
    f = f / "config.json" if f.is_dir() else f
    if not f.is_file():
        raise ValueError(f"--config: no config file at {f}; pass a config.json or the folder of a saved model")
    try:
        raw = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--config: {f} is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--config: {f} holds a JSON {type(raw).__name__}, not a model config object")
    raw = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
    missing = [k for k in ("num_attention_heads", "hidden_size") if k not in raw]
    if missing:
        raise ValueError(f"--config: {f} lacks {', '.join(missing)}; pass a decoder model's config.json")
    return SimpleNamespace(**raw)


def parse_windows(text: str) -> dict[int | None, int]:
    """``--windows``: ``WINDOW[:LAYERS]`` / ``full[:LAYERS]`` entries -> a mapping window -> layers.

    Raises:
        ValueError: an entry that is not of that form.
    """
    out: dict[int | None, int] = {}
    for entry in text.split(","):
        name, _, count = entry.strip().partition(":")
        try:
            window = None if name == "full" else int(name)
            layers = int(count) if count else 1
        except ValueError:
            raise ValueError(f"--windows: bad entry {entry!r}; use WINDOW[:LAYERS] or full[:LAYERS], "
                             "e.g. 1024:5,full:1") from None
        out[window] = out.get(window, 0) + layers
    return out


def make_cost(args: argparse.Namespace) -> CostModel | None:
    """The cost model the arguments ask for (``None``: the planner's default for the link)."""
    link = offline_link(args.P, args.gpus_per_node)
    cost = None
    if args.config or args.hardware:
        config = _load_config(args.config) if args.config else LLAMA3_8B
        cost = CostModel.from_config(config, link, args.hardware or "A100")
    if args.attention_only:
        cost = dataclasses.replace(cost or CostModel.for_link(link), token_cost=0.0)
    return cost


def _row(args: argparse.Namespace) -> np.ndarray:
    """``cu_seqlens`` of the row the arguments describe (raises ``ValueError`` on inconsistent arguments)."""
    if args.lengths:
        lengths = _parse_lengths(args.lengths)
        if args.T is not None and int(lengths.sum()) != args.T:
            raise ValueError(f"--lengths sum to {int(lengths.sum())} but --T is {args.T}")
    else:
        lengths = sample_lengths(args.dist or "longtail", args.T or 131072, args.seed)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def choose_degree(args: argparse.Namespace, cu: np.ndarray, windows) -> tuple[int, dict[int, float] | None]:
    """``--U``: the degree to plan with, and with ``per_batch`` every degree's estimated step time of a rank
    (:func:`~hf_hsap.plan.planner.choose_ulysses_size`, what a ``"per_batch"`` group decides per batch, within its
    memory cap)."""
    if args.U != "per_batch":
        return args.U, None
    model = HSAPConfig(model_config=_load_config(args.config) if args.config else LLAMA3_8B)
    return choose_ulysses_size(cu, args.P, num_heads=int(model.num_heads), gpus_per_node=args.gpus_per_node,
                               cost=make_cost(args), placement=args.placement, windows=windows,
                               num_kv_heads=int(model.num_kv_heads))  # the memory cap weighs received keys


def _windows(args: argparse.Namespace) -> dict[int | None, int] | list | None:
    """The layers' masks the arguments ask for: ``--windows``, else ``--config``'s, else None (full attention)."""
    windows = parse_windows(args.windows) if args.windows else None
    if windows is None and args.config:
        windows = attention_windows(_load_config(args.config))
    return windows


def make_plan(args: argparse.Namespace, cu: np.ndarray | None = None, U: int | None = None) -> Plan:
    """The offline plan the arguments describe (raises ``ValueError`` on inconsistent arguments); ``cu`` / ``U``:
    the row and degree when already resolved (:func:`_row`, :func:`choose_degree`)."""
    cu = _row(args) if cu is None else cu
    windows = _windows(args)
    U = choose_degree(args, cu, windows)[0] if U is None else U
    config = HSAPConfig(sp_size=args.P, ulysses_size=U, placement=args.placement, rounds=args.rounds,
                        recv_budget_tokens=args.budget, gpus_per_node=args.gpus_per_node, cost_model=make_cost(args),
                        windows=windows)
    return plan_sequence(cu, config.sp_size, config.placement, ulysses_size=config.ulysses_size,
                         gpus_per_node=config.gpus_per_node, cost=config.cost_model, **config.plan_options())


def _max_length(args: argparse.Namespace) -> int:
    """``--max-length``: the longest row that fits, its memory by term and what limits it."""
    try:
        config = vars(_load_config(args.config)) if args.config else MEMORY_MODELS[args.model]
        lines = max_length_lines(config, gpus=args.gpus, memory_gib=args.gpu_memory,
                                 levers=levers_from_names(args.levers, checkpoint_layers=args.checkpoint_layers,
                                                          layers_kept_on_device=args.layers_kept_on_device),
                                 sharding=args.sharding, sp_size=args.sp,
                                 ulysses_size=args.U if isinstance(args.U, int) else 1,
                                 recv_budget_tokens=args.budget, offload=args.offload,
                                 host_memory_gib=args.host_memory or None, gpus_per_node=args.gpus_per_node,
                                 footprint_gib=args.host_footprint,
                                 pinned_round_limit_mb=args.pinned_round_limit_mb)
    except ValueError as e:
        print(f"hsap-plan: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point. Returns the exit status (0 ok, 2 bad arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_length:
        return _max_length(args)
    try:
        cu = _row(args)
        U, times = choose_degree(args, cu, _windows(args))
        plan = make_plan(args, cu, U)
    except ValueError as e:
        print(f"hsap-plan: error: {e}", file=sys.stderr)
        return 2
    if times is not None:
        print(f"per-batch Ulysses degree: U = {U} (estimated step time of a rank, pairs: "
              + ", ".join(f"U={u}: {t:.4g}" for u, t in sorted(times.items())) + ")")
    print("\n".join(summary_lines(plan)))
    if args.png:
        write_png(plan, args.png)
        print(f"\nwrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
