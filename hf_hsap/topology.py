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

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .comm.p2p import CommStats, P2PExecutor
from .plan.cache import PlanCache

DEFAULT_TIMEOUT_S = 600.0


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
            ``CostModel.for_link(sap_link)``); the trainers set ``CostModel.from_config(model.config,
            sap_link)``.
        gpus_per_node: ranks per node (global ranks ``n * gpus_per_node ...`` share node ``n``);
            ``None``: unknown (the SAP links are then treated as network links).
        pending_plan_use: the :class:`~hf_hsap.integrations.plan_use.PlanUse` of the last batch
            ``shard_batch`` made for this group, checked at its next call.
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

    @property
    def sap_link(self) -> str:
        """``"nvlink"`` when the whole SP group is inside one node (SAP's KV never leaves it), else
        ``"network"``. Chooses the default cost model of ``plan_sequence(placement="auto")``."""
        g = self.gpus_per_node
        if g is None or g < 1:
            return "network"
        return "nvlink" if len({r // g for r in self.global_ranks}) == 1 else "network"

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
    """The ``ulysses_size="auto"`` rule (the default of :func:`init_sequence_parallel`).

    * The SP group fits in one node (``sp_size`` divides ``gpus_per_node``): ``U = 1``, pure SAP. Every
      link is NVLink, SAP moves only the KV that documents need and balances work within 3%, and it
      has no head-count cap; in the cost model it matches or beats Ulysses on one node (BENCHMARKS.md).
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


def _gpus_per_node(world: int) -> int:
    """Ranks per node: LOCAL_WORLD_SIZE (set by torchrun / accelerate launch), else visible GPUs, else the
    whole world (CPU runs are one node)."""
    import os

    env = os.environ.get("LOCAL_WORLD_SIZE")
    if env:
        return int(env)
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() and torch.cuda.device_count() > 0 else world


def init_sequence_parallel(sp_size: int, ulysses_size: int | str = "auto", group: Any = None,
                           timeout_s: float = DEFAULT_TIMEOUT_S, num_heads: int | None = None,
                           gpus_per_node: int | None = None, grad_comm_dtype: Any = None) -> SPGroup:
    """Split the initialised world (or ``group``) into consecutive SP groups of ``sp_size`` ranks.

    Every rank of the world (of ``group``) must call this, in the same order relative to other group
    creations: it creates process groups collectively.

    Args:
        sp_size: P, ranks sharing one packed batch.
        ulysses_size: U, the all-to-all degree inside each SP group (must divide ``sp_size``), or
            ``"auto"`` (default): :func:`auto_ulysses_size` with ``gpus_per_node`` and ``num_heads``
            (1 when the SP group fits in one node, else Ulysses inside each node and SAP between).
        group: the parent group; default the whole initialised world.
        timeout_s: timeout of the created groups: a peer that died or stalls makes the others raise
            after this many seconds instead of hanging.
        num_heads: query heads of the model, for ``ulysses_size="auto"``.
        gpus_per_node: ranks per node, for ``"auto"`` and the planner's link costs (default:
            LOCAL_WORLD_SIZE, else GPUs, else world).
        grad_comm_dtype: dtype of the dK/dV partial sums SAP returns to their owners (``None``: the
            inputs' dtype; ``torch.float32``: the fp32 accumulators, 2x the bytes in bf16).

    Returns:
        This rank's :class:`SPGroup`.

    Raises:
        ValueError: when ``sp_size`` does not divide the world or ``ulysses_size`` does not divide
            ``sp_size``; RuntimeError when torch.distributed is not initialised and ``sp_size > 1``.
    """
    world_now = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    gpus_per_node = gpus_per_node or _gpus_per_node(world_now)
    if ulysses_size == "auto":
        ulysses_size = auto_ulysses_size(sp_size, gpus_per_node, num_heads)
    if not dist.is_available() or not dist.is_initialized():
        if sp_size == 1 and ulysses_size == 1:
            return SPGroup.single()
        raise RuntimeError(
            f"sp_size={sp_size} needs at least {sp_size} processes, but this is a single process (torch.distributed "
            f"is not initialised): launch {sp_size} or more, e.g. `accelerate launch --num_processes {sp_size} ...` "
            "(on CPU: --config_file accelerate_configs/cpu_4proc.yaml) or `torchrun --nproc_per_node "
            f"{sp_size} ...`, and create the Accelerator (or call dist.init_process_group) before this call"
        )
    _check_accelerate_world(dist.get_world_size())
    members = list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group)
    world = len(members)
    _validate(world, sp_size, ulysses_size)
    me = members.index(dist.get_rank())
    timeout = timedelta(seconds=timeout_s)
    U, R, n_sp = ulysses_size, sp_size // ulysses_size, world // sp_size
    mine: dict[str, Any] = {}

    def make(name: str, ranks: list[int]) -> None:
        g = dist.new_group(ranks=[members[i] for i in ranks], timeout=timeout) if len(ranks) > 1 else None
        if me in ranks:
            mine[name] = g

    for s in range(n_sp):
        make("sp", list(range(s * sp_size, (s + 1) * sp_size)))
    for s in range(n_sp):
        for r in range(R):
            make("intra", [s * sp_size + r * U + u for u in range(U)])
        for u in range(U):
            make("inter", [s * sp_size + r * U + u for r in range(R)])
    for j in range(sp_size):
        make("dp", [s * sp_size + j for s in range(n_sp)])
    # One barrier per group, in the same order on every rank: each communicator is created with all of its
    # ranks before the runtime's first batched P2P, which may involve only some of them (NCCL requires the
    # first operation on a group to involve every rank; gloo runs the same path here)
    for name in ("sp", "intra", "inter", "dp"):
        if mine.get(name) is not None:
            dist.barrier(group=mine[name])
    s_me = me // sp_size
    sp = SPGroup(
        size=sp_size, ulysses_size=U, rank=me % sp_size, group=mine.get("sp"),
        global_ranks=tuple(members[s_me * sp_size + j] for j in range(sp_size)),
        intra_group=mine.get("intra"), inter_group=mine.get("inter"), dp_size=n_sp, dp_rank=s_me,
        dp_group=mine.get("dp"), timeout_s=timeout_s, gpus_per_node=gpus_per_node,
        grad_comm_dtype=grad_comm_dtype,
    )
    sp.device_mesh = _device_mesh(members, n_sp, R, U)
    return sp


def _check_accelerate_world(world: int) -> None:
    """Refuse an Accelerate state that counts other processes than torch.distributed has.

    A bare ``Accelerator()`` on a CPU machine under ``accelerate launch`` with a multi-process config
    initialises the process group but reports one process (``DistributedType.NO``): ``prepare()`` then
    returns the model without DDP and the ranks train apart, silently.
    """
    try:
        from accelerate.state import PartialState
    except ImportError:  # pragma: no cover - accelerate is a dependency
        return
    shared = getattr(PartialState, "_shared_state", {})
    n = shared.get("num_processes")
    if n is not None and int(n) != world:
        raise ValueError(
            f"Accelerate's state counts {n} process(es) but torch.distributed has {world}: prepare() would not wrap "
            "the model for data parallelism and the ranks would train apart. On CPU create the Accelerator with "
            "Accelerator(cpu=True) (or PartialState(cpu=True)) before init_sequence_parallel; on GPUs launch with "
            "a config whose distributed_type matches (accelerate_configs/)"
        )


def _device_mesh(members: list[int], dp: int, R: int, U: int) -> Any:
    """A DeviceMesh with dims (dp, sp_inter, sp_intra), or None where the backend cannot build one."""
    try:
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
        mesh = torch.tensor(members, dtype=torch.int64).view(dp, R, U)  # [dp, sp_inter, sp_intra]
        return DeviceMesh(device_type, mesh, mesh_dim_names=("dp", "sp_inter", "sp_intra"))
    except Exception:  # noqa: BLE001 - the mesh is a convenience view; groups above are authoritative
        return None
