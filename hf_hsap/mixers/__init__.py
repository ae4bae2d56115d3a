"""Recurrent token mixers of hybrid models (linear attention, state-space scans, short convolutions), cut at document
boundaries, their states handed from rank to rank under SP.

- :mod:`.handoff`: run a mixer segment by segment (:func:`run_segments`), exchanging split documents' states;
- :mod:`.ops`: Transformers' recurrent kernels as segment ops (:data:`OPS`).

- :mod:`.layers`: which layers of a model are such mixers (:func:`mixer_layers`).

What binds them to a model is :mod:`hf_hsap.integrations.mixer_hooks` (``prepare_model`` calls it).
"""
from .handoff import SegmentOp, StateExchange, run_segments
from .layers import mixer_layers
from .ops import OPS

__all__ = ["OPS", "SegmentOp", "StateExchange", "mixer_layers", "run_segments"]
