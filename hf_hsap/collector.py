"""The pause of Python's cyclic garbage collector while a plan is made (:func:`hf_hsap.plan_sequence`; the planner
package itself stays free of process-wide state).

A plan allocates thousands of lists and tuples in its greedy passes, refinements and searches (plain Python
scalars: :mod:`.balanced`, :mod:`.density`, :mod:`.refine`, :mod:`.cutting`) and keeps many of them until it
returns, so the collector's youngest generation fills during every plan; each collection then walks every young
list element by element, a cost that grows with the plan and frees nothing (see BENCHMARKS.md, planning time).
The planner makes no reference cycles (a test holds it to that), and reference counting frees what it drops, so
nothing is lost by pausing the collector while it plans, and a paused plan triggers no collection when it ends
either (what it leaves alive is its plan). No library offers this (it is the
standard library's ``gc.disable`` / ``gc.enable``, restored exactly).
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block; on leaving it (also by an exception) enable it again
    if and only if it was enabled on entering (a caller that disabled it keeps it disabled; a nested pause
    leaves it to the outer one).

    Yields:
        Nothing.
    """
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
