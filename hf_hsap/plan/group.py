"""GroupSpec: all the pure planner knows of an SP group, as data (``SPGroup.spec``, or built offline)."""
from __future__ import annotations

from dataclasses import dataclass

LINKS = ("nvlink", "network")


@dataclass(frozen=True)
class GroupSpec:
    """An SP group as data."""

    size: int  # P, ranks in the group
    ulysses_size: int = 1  # U, ranks of an all-to-all group (R = P // U parts)
    rank: int | None = None  # the planning rank's index (None: offline)
    link: str = "network"  # what SAP's KV crosses: "nvlink" (one node) or "network"; picks the default cost model

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
        """A group of ``size`` ranks with no rank of its own, its link from :func:`offline_link`."""
        return GroupSpec(size, ulysses_size, None, offline_link(size, gpus_per_node))


def offline_link(size: int, gpus_per_node: int | None) -> str:
    """``"nvlink"`` when ``size`` ranks fit in one node of ``gpus_per_node`` (None: unknown), else ``"network"``."""
    return "nvlink" if gpus_per_node and gpus_per_node % size == 0 else "network"
