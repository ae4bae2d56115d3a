"""Recurrent token mixers of hybrid models (linear attention, state-space scans, short convolutions), cut at document
boundaries; a split document's runs run on every rank at once, joined by one exchange of fixed-size summaries.

- :mod:`.handoff`: run a mixer's runs (:func:`run_segments`), summaries exchanged and folded for split documents;
- :mod:`.ops`, :mod:`.scans`: Transformers' recurrent kernels as :class:`Recurrence` s (:data:`OPS`);
- :mod:`.calls`: how a kernel call is read and run (several runs in one padded call);
- :mod:`.heads`, :mod:`.heads_specs`: the heads all-to-all mode (whole documents per rank, the heads sharded);
- :mod:`.layers`: which layers of a model are such mixers (:func:`mixer_layers`).

What binds them to a model is :mod:`hf_hsap.integrations.mixer_hooks` (``prepare_model`` calls it).
"""
from .handoff import Recurrence, SegmentOp, StateExchange, Summary, run_segments
from .layers import mixer_layers
from .ops import OPS

__all__ = ["OPS", "Recurrence", "SegmentOp", "StateExchange", "Summary", "mixer_layers", "run_segments"]
