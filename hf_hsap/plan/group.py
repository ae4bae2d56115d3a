"""GroupSpec: the plain description of an SP group that the planner needs (no process group).

The planner is pure: it never talks to other ranks and never asks a device anything. Everything it
needs to know about the group is here; :class:`hf_hsap.topology.SPGroup` describes itself with
:attr:`~hf_hsap.topology.SPGroup.spec`, and offline planning (benchmarks, ``hsap-plan``) builds one
from an int size.
"""
from __future__ import annotations

from dataclasses import dataclass

LINKS = ("nvlink", "network")


@dataclass(frozen=True)
class GroupSpec:
    """An SP group as data.

    Attributes:
        size: P, ranks in the group.
        ulysses_size: U, ranks of an intra (all-to-all) group; ``R = size // U`` parts.
        rank: the planning rank's index in the group (``None``: offline, no rank of its own).
        link: what SAP's KV crosses: ``"nvlink"`` (the whole group inside one node) or ``"network"``;
            chooses the default cost model.
    """

    size: int
    ulysses_size: int = 1
    rank: int | None = None
    link: str = "network"

    def __post_init__(self) -> None:
        size, U = self.size, self.ulysses_size
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (size, U)):
            raise ValueError(f"the SP size and ulysses_size must be ints, got {size!r} and {U!r}")
        if size < 1 or U < 1 or size % U != 0:
            raise ValueError(f"the SP size ({size}) must be a positive multiple of ulysses_size ({U})")
        if self.rank is not None and not 0 <= self.rank < size:
            raise ValueError(f"rank {self.rank} out of range for SP size {size}")
        if self.link not in LINKS:
            raise ValueError(f"unknown link {self.link!r}; use 'nvlink' (one node) or 'network' (between nodes)")

    @property
    def n_parts(self) -> int:
        """R: parts of the placement (``size // ulysses_size``)."""
        return self.size // self.ulysses_size

    @staticmethod
    def offline(size: int, ulysses_size: int = 1, gpus_per_node: int | None = None) -> "GroupSpec":
        """A group with no rank of its own.

        Args:
            size: P. ulysses_size: U. gpus_per_node: ranks per node (None: unknown).

        Returns:
            The spec; its link is ``"nvlink"`` when ``size`` ranks fit in one node (:func:`offline_link`).
        """
        return GroupSpec(size, ulysses_size, None, offline_link(size, gpus_per_node))


def offline_link(size: int, gpus_per_node: int | None) -> str:
    """The link SAP's KV crosses for an offline group.

    Args:
        size: ranks of the group. gpus_per_node: ranks per node (None: unknown).

    Returns:
        ``"nvlink"`` when the group fits in one node of ``gpus_per_node`` ranks, else ``"network"``.
    """
    return "nvlink" if gpus_per_node and gpus_per_node % size == 0 else "network"
