"""SPGroup: the ranks that share one packed batch, and their sub-groups.

An SP group of ``P = U x R`` consecutive ranks is ``R`` intra groups of ``U`` consecutive ranks
(Ulysses all-to-all over heads, meant for the fast links inside a node) and ``U`` inter groups of
``R`` ranks with the same intra index (SAP point-to-point, meant for links between nodes). Data
parallelism runs across SP groups. Groups are created by :func:`init_sequence_parallel` on call,
never at import, and live on the returned object (no module globals)::

    world 8, sp_size 4, ulysses 2:   dp 0: sp ranks [0 1 | 2 3]   dp 1: sp ranks [4 5 | 6 7]
                                      intra groups {0,1} {2,3} {4,5} {6,7}
                                      inter groups {0,2} {1,3} {4,6} {5,7};   dp groups {0,4} {1,5} ...
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .comm.p2p import CommStats, P2PExecutor
from .config import DEFAULT_TIMEOUT_S, ULYSSES_MODES, HSAPConfig, resolve_ulysses_size
from .launch_checks import check_accelerate_world, check_parallelism_config
from .plan.cache import PlanCache
from .plan.group import GroupSpec

__all__ = ["SPGroup", "auto_ulysses_size", "check_parallelism_config", "finish_distributed", "init_sequence_parallel",
           "ulysses_degrees"]

logger = logging.getLogger(__name__)


class DegreeGroups(MutableMapping):
    """``{U: SPGroup}`` of :attr:`SPGroup.degrees`: a mapping, not a ``dict``, so that walkers of a forward's keyword
    arguments (FSDP2's search for tensors in ``hsap_plan``, ``torch.utils._pytree``) stop here: the default degree's
    group is its own entry, a cycle they would follow until their depth limit."""

    def __init__(self) -> None:
        self._groups: dict[int, SPGroup] = {}

    def __getitem__(self, u: int) -> "SPGroup":
        return self._groups[u]

    def __setitem__(self, u: int, group: "SPGroup") -> None:
        self._groups[u] = group

    def __delitem__(self, u: int) -> None:
        del self._groups[u]

    def __iter__(self) -> Iterator[int]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)


@dataclass(eq=False)
class SPGroup:
    """One rank's view of its sequence-parallel group.

    Attributes:
        size: P, ranks in the SP group.
        ulysses_size: U, ranks of an intra (all-to-all) group; ``R = size // U``.
        rank: this rank's index inside the SP group (``inter_rank * U + intra_rank``).
        group: the SP process group (``None`` when ``size == 1``).
        global_ranks: global rank of every SP rank.
        intra_group / inter_group: this rank's sub-groups (``None`` when of size 1).
        dp_size / dp_rank / dp_group: data parallelism across SP groups.
        timeout_s: collective / point-to-point timeout of the groups.
        plan_cache: plans of this group (LRU).
        comm_stats: what this rank's executor really sent and received.
        grad_comm_dtype: dtype of the dK/dV partial sums SAP sends back (``None``: the inputs' dtype).
        cost_model: the :class:`~hf_hsap.CostModel` its plans use by default (``None``:
            ``CostModel.for_link(sap_link)``); ``init_sequence_parallel`` sets ``config.cost_for(sap_link)``
            (``CostModel.from_config(model_config, sap_link, detect_hardware())`` when the config has a model config).
        gpus_per_node: ranks per node (global ranks ``n * gpus_per_node ...`` share node ``n``);
            ``None``: unknown (the SAP links are then treated as network links).
        pending_plan_use: the :class:`~hf_hsap.integrations.plan_use.PlanUse` of the last batch
            ``shard_batch`` made for this group, checked at its next call.
        config: the :class:`~hf_hsap.HSAPConfig` the group was made from (``ulysses_size`` resolved):
            ``shard_batch`` and the SP loader plan with its placement, rounds and budget.
        device_mesh: the ``DeviceMesh`` (dims ``dp, sp_inter, sp_intra``) the groups come from.
        degrees: with ``ulysses_size="per_batch"``, this group at every Ulysses degree it can run
            (``{U: SPGroup}``, this one included; the same ranks, SP process group, plan cache and counters,
            each degree with its own intra and inter groups): :func:`hf_hsap.plan_sequence` plans every batch
            for the degree the cost model prices fastest and binds the plan to that group
            (:func:`hf_hsap.sp_plan.plan_per_batch`). Empty: one degree, ``ulysses_size``.
        heads: ``(query heads, key/value heads)`` of the model when known (what the per-batch choice weighs the
            degrees' activation memory with), else ``None``.
    """

    size: int
    ulysses_size: int
    rank: int
    group: Any = None
    global_ranks: tuple[int, ...] = (0,)
    intra_group: Any = None
    inter_group: Any = None
    dp_size: int = 1
    dp_rank: int = 0
    dp_group: Any = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    device_mesh: Any = None
    plan_cache: PlanCache = field(default_factory=PlanCache)
    comm_stats: CommStats = field(default_factory=CommStats)
    gpus_per_node: int | None = None
    grad_comm_dtype: Any = None
    cost_model: Any = None
    pending_plan_use: Any = None
    config: HSAPConfig = field(default_factory=HSAPConfig)
    degrees: DegreeGroups = field(default_factory=DegreeGroups)
    heads: tuple[int, int] | None = None

    @property
    def sap_link(self) -> str:
        """``"nvlink"`` when the whole SP group is inside one node (SAP's KV never leaves it), else
        ``"network"``. Chooses the default cost model of ``plan_sequence(placement="auto")``."""
        g = self.gpus_per_node
        if g is None or g < 1:
            return "network"
        return "nvlink" if len({r // g for r in self.global_ranks}) == 1 else "network"

    @property
    def spec(self) -> GroupSpec:
        """This group as the planner sees it (size, Ulysses size, this rank, SAP link): plain data."""
        return GroupSpec(self.size, self.ulysses_size, self.rank, self.sap_link)

    @property
    def ring_size(self) -> int:
        """R, the number of intra groups (inter-SP degree)."""
        return self.size // self.ulysses_size

    @property
    def intra_rank(self) -> int:
        return self.rank % self.ulysses_size

    @property
    def inter_rank(self) -> int:
        return self.rank // self.ulysses_size

    def inter_executor(self) -> P2PExecutor:
        """Executor whose peers are the R inter peers (peer index = inter rank)."""
        peers = [self.global_ranks[r * self.ulysses_size + self.intra_rank] for r in range(self.ring_size)]
        return P2PExecutor(self.group, peers, self.comm_stats, self.timeout_s)

    @staticmethod
    def single() -> "SPGroup":
        """A group of one rank (no communication)."""
        return SPGroup(size=1, ulysses_size=1, rank=0)


def _validate(world: int, sp_size: int, ulysses_size: int) -> None:
    if not isinstance(sp_size, int) or sp_size < 1:
        raise ValueError(f"sp_size must be a positive int, got {sp_size!r}")
    if not isinstance(ulysses_size, int) or ulysses_size < 1:
        raise ValueError(f"ulysses_size must be a positive int, got {ulysses_size!r}")
    if world % sp_size != 0:
        raise ValueError(f"sp_size={sp_size} does not divide the world size {world}; launch a multiple of "
                         f"{sp_size} processes or pick an sp_size that divides {world}")
    if sp_size % ulysses_size != 0:
        raise ValueError(f"ulysses_size={ulysses_size} does not divide sp_size={sp_size}; pick a divisor of "
                         f"{sp_size} (e.g. the GPUs per node)")


def auto_ulysses_size(sp_size: int, gpus_per_node: int, num_heads: int | None = None) -> int:
    """The ``ulysses_size="auto"`` rule (the default of :func:`init_sequence_parallel` when the model's heads are
    unknown).

    * The SP group fits in one node (``sp_size`` divides ``gpus_per_node``): ``U = 1``, pure SAP. Every
      link is NVLink, SAP moves only the KV that documents need and balances work, and it has no
      head-count cap; how it compares with Ulysses on one node is in BENCHMARKS.md (cost model).
    * Otherwise: the largest U that divides ``sp_size``, fits in one node (divides ``gpus_per_node``)
      and divides the number of query heads. Inside a node the all-to-all runs over NVLink, an order
      of magnitude faster than the inter-node links, and it leaves SAP only ``R = sp_size / U`` parts,
      so fewer documents are split and less KV crosses nodes. Key/value heads that U does not divide
      are replicated as far as needed (``hsap_attn_func``), which costs a little all-to-all volume.

    Args:
        sp_size: P.
        gpus_per_node: ranks that share the fast links.
        num_heads: query heads of the model (None: not limiting).

    Returns:
        U (>= 1).
    """
    if gpus_per_node % sp_size == 0:
        return 1
    best = 1
    for u in range(1, sp_size + 1):
        if sp_size % u == 0 and gpus_per_node % u == 0 and (num_heads is None or num_heads % u == 0):
            best = u
    return best


def ulysses_degrees(sp_size: int, gpus_per_node: int, num_heads: int | None) -> list[int]:
    """The Ulysses degrees ``ulysses_size="per_batch"`` builds groups for: every ``U`` that divides ``sp_size``
    and the query heads and keeps the all-to-all inside a node (divides ``gpus_per_node``), up to
    ``U = sp_size`` (DeepSpeed Ulysses) when the group fits in one node.

    Args:
        sp_size: P. gpus_per_node: ranks that share the fast links. num_heads: query heads of the model.

    Returns:
        The degrees, ascending (1 always among them).

    Raises:
        ValueError: ``num_heads`` unknown (a degree must divide the heads).
    """
    if not num_heads:
        raise ValueError("ulysses_size='per_batch' needs the model's query heads: pass num_heads=... to "
                         "init_sequence_parallel or HSAPConfig(model_config=model.config), or pick one degree "
                         "(ulysses_size='auto' or an int)")
    return [u for u in range(1, sp_size + 1) if sp_size % u == 0 and num_heads % u == 0 and gpus_per_node % u == 0]


def _gpus_per_node(world: int) -> int:
    """Ranks per node: LOCAL_WORLD_SIZE (set by torchrun / accelerate launch), else visible GPUs, else the
    whole world (CPU runs are one node)."""
    import os

    env = os.environ.get("LOCAL_WORLD_SIZE")
    if env:
        return int(env)
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() and torch.cuda.device_count() > 0 else world


def init_sequence_parallel(sp_size: int | HSAPConfig = 1, ulysses_size: int | str | None = None, *, group: Any = None,
                           timeout_s: float = DEFAULT_TIMEOUT_S, num_heads: int | None = None,
                           gpus_per_node: int | None = None, grad_comm_dtype: Any = None,
                           num_kv_heads: int | None = None) -> SPGroup:
    """Split the initialised world into consecutive SP groups of ``sp_size`` ranks, taken from one
    ``DeviceMesh`` with dims ``(dp, sp_inter, sp_intra)``.

    Every rank of the world must call this, in the same order relative to other group creations: it
    creates process groups collectively. The mesh's groups are the only communicators: ``sp_intra`` is the
    Ulysses group, ``sp_inter`` SAP's, ``dp`` the data-parallel one, and the SP group is ``sp_inter`` or
    ``sp_intra`` when the other has one rank, else the two dims flattened (``DeviceMesh._flatten``).

    Args:
        sp_size: P, ranks sharing one packed batch, or an :class:`~hf_hsap.HSAPConfig` (then the other
            arguments are taken from it and must be left at their defaults).
        ulysses_size: U, the all-to-all degree inside each SP group (must divide ``sp_size``),
            ``"auto"``: :func:`auto_ulysses_size` with ``gpus_per_node`` and ``num_heads`` (1 when the SP group
            fits in one node, else Ulysses inside each node and SAP between), or ``"per_batch"``: groups for
            every degree of :func:`ulysses_degrees` (``num_heads`` needed), each batch planned for the fastest by
            the cost model (``SPGroup.degrees``, :func:`hf_hsap.sp_plan.plan_per_batch`); the returned group is
            the ``"auto"`` degree's. ``None`` (default): :func:`hf_hsap.config.resolve_ulysses_size`.
        group: must be ``None`` or span the whole world (the mesh is built over the world).
        timeout_s: timeout of the created groups: a peer that died or stalls makes the others raise
            after this many seconds instead of hanging.
        num_heads: query heads of the model, for ``ulysses_size="auto"`` / ``"per_batch"`` (default: the
            config's ``model_config``).
        gpus_per_node: ranks per node, for ``"auto"`` and the planner's link costs (default:
            LOCAL_WORLD_SIZE, else GPUs, else world).
        grad_comm_dtype: dtype of the dK/dV partial sums SAP returns to their owners (``None``: the
            inputs' dtype; ``torch.float32``: the fp32 accumulators, 2x the bytes in bf16).
        num_kv_heads: key/value heads of the model, for the per-batch degree's memory cap (default: the config's
            ``model_config``, else ``num_heads``).

    Returns:
        This rank's :class:`SPGroup` (its ``config`` holds the options, ``device_mesh`` the mesh).

    Raises:
        ValueError: when ``sp_size`` does not divide the world or ``ulysses_size`` does not divide
            ``sp_size``, a ``group`` that is not the world, an Accelerate state that counts other processes
            than torch.distributed, or a conflicting Accelerate ``ParallelismConfig``
            (:func:`check_parallelism_config`); RuntimeError when torch.distributed is not initialised and
            ``sp_size > 1``; TypeError for options given both in an ``HSAPConfig`` and as arguments.
    """
    if isinstance(sp_size, HSAPConfig):
        config = sp_size
        extra = {k: v for k, v, d in (("ulysses_size", ulysses_size, None), ("group", group, None),
                                       ("timeout_s", timeout_s, DEFAULT_TIMEOUT_S), ("gpus_per_node", gpus_per_node, None),
                                       ("grad_comm_dtype", grad_comm_dtype, None)) if v != d}
        if extra:
            raise TypeError(f"init_sequence_parallel(HSAPConfig, ...) takes its options from the config; set "
                            f"{sorted(extra)} there (config.replace(...))")
    else:
        config = HSAPConfig(sp_size=sp_size, ulysses_size=ulysses_size, timeout_s=timeout_s,
                            gpus_per_node=gpus_per_node, grad_comm_dtype=grad_comm_dtype)
    sp_size, timeout_s = config.sp_size, float(config.timeout_s)
    num_heads = num_heads or config.num_heads
    num_kv_heads = num_kv_heads or (config.num_kv_heads if config.num_heads == num_heads else None) or num_heads
    heads = (num_heads, num_kv_heads) if num_heads else None
    world_now = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    gpus_per_node = config.gpus_per_node or _gpus_per_node(world_now)
    ulysses_size = resolve_ulysses_size(config.ulysses_size, num_heads, sp_size)
    per_batch = ulysses_size == "per_batch"
    if per_batch:
        degrees = ulysses_degrees(sp_size, gpus_per_node, num_heads) if sp_size > 1 else [1]
    if ulysses_size in ULYSSES_MODES:
        ulysses_size = auto_ulysses_size(sp_size, gpus_per_node, num_heads)
    if not dist.is_available() or not dist.is_initialized():
        if sp_size == 1 and ulysses_size == 1:
            sp = SPGroup(size=1, ulysses_size=1, rank=0, timeout_s=timeout_s, gpus_per_node=gpus_per_node,
                         grad_comm_dtype=config.grad_comm_dtype, config=config.replace(ulysses_size=1))
            sp.cost_model = config.cost_for(sp.sap_link)
            return sp
        raise RuntimeError(
            f"sp_size={sp_size} needs at least {sp_size} processes, but this is a single process (torch.distributed "
            f"is not initialised): launch {sp_size} or more, e.g. `accelerate launch --num_processes {sp_size} ...` "
            "(on CPU: --config_file accelerate_configs/cpu_4proc.yaml) or `torchrun --nproc_per_node "
            f"{sp_size} ...`, and create the Accelerator (or call dist.init_process_group) before this call"
        )
    check_accelerate_world(dist.get_world_size())
    check_parallelism_config()
    world = dist.get_world_size()
    if group is not None and dist.get_process_group_ranks(group) != list(range(world)):
        raise ValueError("init_sequence_parallel builds its groups from a DeviceMesh over the whole world; pass "
                         "group=None (SP groups are consecutive ranks, data parallelism runs across them)")
    _validate(world, sp_size, ulysses_size)
    shared = {"timeout_s": timeout_s, "gpus_per_node": gpus_per_node, "grad_comm_dtype": config.grad_comm_dtype,
              "heads": heads, "config": config.replace(ulysses_size="per_batch" if per_batch else ulysses_size)}
    sp = _build_group(sp_size, ulysses_size, None, shared)
    sp.cost_model = config.cost_for(sp.sap_link)
    if per_batch:  # one set of groups per degree (same SP group, plan cache and counters): sp_plan.plan_per_batch
        sp.degrees[ulysses_size] = sp
        for u in degrees:
            if u != ulysses_size:
                sp.degrees[u] = _build_group(sp_size, u, sp.group, dict(shared, plan_cache=sp.plan_cache,
                                                                         comm_stats=sp.comm_stats))
        logger.info("hf_hsap: ulysses_size='per_batch': groups for degrees %s (default %d)", sorted(sp.degrees),
                    ulysses_size)
    return sp


def _build_group(sp_size: int, U: int, sp_group: Any, shared: dict[str, Any]) -> SPGroup:
    """This rank's :class:`SPGroup` of Ulysses degree ``U`` (collective: every rank, same order).

    Args:
        sp_size: P. U: the degree (divides P). sp_group: the SP process group to reuse (its ranks are the same
            for every degree), or None to take it from the new mesh. shared: further :class:`SPGroup` fields.

    Returns:
        The group; its ``device_mesh`` has dims ``dp, sp_inter, sp_intra`` = ``[world / P, P / U, U]``.
    """
    world, me = dist.get_world_size(), dist.get_rank()
    R, n_sp, timeout_s = sp_size // U, world // sp_size, float(shared["timeout_s"])
    mesh = _device_mesh(n_sp, R, U, timeout_s)

    def dim_group(name: str) -> Any:
        return mesh.get_group(name) if mesh[name].size() > 1 else None

    intra, inter = dim_group("sp_intra"), dim_group("sp_inter")
    if sp_group is None and (U == 1 or R == 1):
        sp_group = inter if U == 1 else intra
    elif sp_group is None:  # both dims > 1: one more communicator over the U x R ranks of the group
        sp_group = mesh["sp_inter", "sp_intra"]._flatten("sp", backend_override=_group_options(timeout_s)).get_group()
    # One barrier per group, in the same order on every rank: each communicator is created with all of its
    # ranks before the runtime's first batched P2P, which may involve only some of them (NCCL requires the
    # first operation on a group to involve every rank; gloo runs the same path here)
    for g in dict.fromkeys(x for x in (sp_group, intra, inter, dim_group("dp")) if x is not None):
        dist.barrier(group=g)
    s_me = me // sp_size
    return SPGroup(size=sp_size, ulysses_size=U, rank=me % sp_size, group=sp_group,
                   global_ranks=tuple(s_me * sp_size + j for j in range(sp_size)), intra_group=intra,
                   inter_group=inter, dp_size=n_sp, dp_rank=s_me, dp_group=dim_group("dp"), device_mesh=mesh,
                   **shared)


def _group_options(timeout_s: float) -> tuple[str, Any]:
    """(backend, options) of a mesh group with this timeout: NCCL when the default group has it (also in a
    mixed ``"cpu:gloo,cuda:nccl"`` group), else gloo."""
    if "nccl" in dist.get_backend():
        backend, options = "nccl", dist.ProcessGroupNCCL.Options()
    else:
        backend, options = "gloo", dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    return backend, options


def _device_mesh(dp: int, R: int, U: int, timeout_s: float) -> Any:
    """The world as a DeviceMesh with dims ``(dp, sp_inter, sp_intra)`` = ``[dp, R, U]``; every dim's group
    gets ``timeout_s``. Rank ``s * P + r * U + u`` is data-parallel replica ``s``, inter rank ``r``, intra
    rank ``u``."""
    from torch.distributed.device_mesh import init_device_mesh

    device_type = "cuda" if "nccl" in dist.get_backend() else "cpu"
    names = ("dp", "sp_inter", "sp_intra")
    return init_device_mesh(device_type, (dp, R, U), mesh_dim_names=names,
                            backend_override={name: _group_options(timeout_s) for name in names})


def finish_distributed() -> None:
    """Destroy the process groups at the end of a script, after the run's models are gone (collective).

    Order matters with gloo. A process group whose last reference is a DDP reducer is destroyed when the model
    is garbage-collected, and gloo's destructor joins its worker threads while holding the GIL; a worker that
    is still releasing its last work item (tensors with Python objects) waits for the GIL, and the rank hangs
    after training. ``accelerator.end_training()`` destroys the groups first, which makes exactly that
    happen, so the recipes and ``HSAPTrainer.end`` finish their trackers themselves and call this once the model is freed (or
    before it is, since the groups are destroyed only after the barrier): while the
    groups are still registered, freeing a model destroys none; then a barrier and a short sleep (without the
    GIL) let the workers go idle, and the groups are destroyed.
    """
    import gc
    import time

    import torch.distributed as dist

    gc.collect()  # reference cycles (trainer <-> callbacks) that still hold a model
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        time.sleep(0.1)
        dist.destroy_process_group()
