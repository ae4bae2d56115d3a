"""Everything hf_hsap keeps on a model's modules, named once, and the journal that takes it away again.

:func:`hf_hsap.prepare_model` is the one place that changes a model. Each change goes through a
:class:`ModelChanges` journal (an attribute set on a module or an object, a hook registered, a call to undo), so
``PreparedModel.undo()`` restores the model exactly: its forwards, hooks, head and state dict. The modules that read
this state (the attention, the recurrent layers, the vision rows) read it through the names below, never through a
string of their own.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ATTENTION_TILES", "CAUSAL_LAYER", "DEPTH", "ENCODER_PART", "INDEXED", "INDEXED_DOCS", "INDEXED_MASK", "MIXERS", "MIXERS_READY",
           "ModelChanges", "PREFIX_LM", "RELATIVE_BIAS",
           "PREPARED", "PROBE_KEY", "RELAY", "VISION_ROWS", "state_of"]

# Attributes stored in a module's ``__dict__`` (never on its class).
MIXERS = "_hsap_mixers"  # the model's MixerContext (hybrid models: the layout every recurrent layer reads)
MIXERS_READY = "_hsap_mixers_ready"  # on every module of a model whose recurrent layers are prepared
RELAY = "_hsap_relay"  # the PlanRelay of a model and of the attention layers its kwargs do not reach
VISION_ROWS = "_hsap_vision_rows"  # a vision-language model's row selection (this rank's feature rows)
PREPARED = "_hsap_prepared"  # the PreparedModel of a model prepare_model changed
PREFIX_LM = "_hsap_prefix_lm"  # a prefix-LM decoder's attention layer: causal by its model's mask (PaliGemma)
CAUSAL_LAYER = "_hsap_causal_layer"  # an attention layer its model's image blocks skip (Gemma 4's full attention)
ATTENTION_TILES = "_hsap_attention_tiles"  # an attention layer's query tile (tokens) of the tiled_attention lever
INDEXED = "_hsap_indexed"  # an indexed-attention layer whose top-k runs per document (integrations/indexed.py)
INDEXED_DOCS = "_hsap_indexed_docs"  # the documents of the current forward, on an indexed layer's indexer
ENCODER_PART = "_hsap_encoder_part"  # a non-causal attention layer of a VLM's image path under a text config (Kosmos-2's
# image-to-text projection): it runs on one item's rows, as an encoder's layer
INDEXED_MASK = "_hsap_indexed_mask"  # the current forward's document-causal mask, on a layer that builds its own
RELATIVE_BIAS = "_hsap_relative_bias"  # an attention layer whose position_bias is its per-query table (its width)
DEPTH = "_hsap_depth_attention"  # a layer attending over each token's own layer states (Inkling 2's residuals)

# The keyword argument of check_model's probe forward (the attention layers it reaches get the SP plan too).
PROBE_KEY = "hsap_kwargs_probe"

_ABSENT = object()


def state_of(module: Any, name: str) -> Any:
    """The state ``name`` stored on ``module`` (``None`` when absent).

    Args:
        module: a module (or any object with a ``__dict__``). name: one of this module's attribute names.
    """
    return module.__dict__.get(name)


class ModelChanges:
    """A journal of what was changed on a model, undone in reverse order.

    Every change is recorded before it is made, so a failure half-way through a preparation can still be undone.
    """

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._undo)

    def keep(self, obj: Any, name: str) -> None:
        """Record ``obj.name`` as it is now, to be restored on undo (a change a library call is about to make).

        The instance's own attribute is restored, or deleted when ``obj`` had none of its own (the class's attribute
        shows through again); an ``nn.Module``'s submodule is put back in place.

        Args:
            obj: a module, a kernel wrapper or a config. name: the attribute.
        """
        modules = getattr(obj, "_modules", None)
        if isinstance(modules, dict) and name in modules:  # nn.Module keeps submodules out of __dict__
            before = modules[name]
        else:
            before = getattr(obj, "__dict__", {}).get(name, _ABSENT)

        def undo() -> None:
            if before is not _ABSENT:
                setattr(obj, name, before)
            elif name in getattr(obj, "__dict__", {}):
                delattr(obj, name)

        self._undo.append(undo)

    def set(self, obj: Any, name: str, value: Any) -> None:
        """``setattr(obj, name, value)``, undone as :meth:`keep` says.

        Args:
            obj: a module, a kernel wrapper or a config. name: the attribute. value: its new value.
        """
        self.keep(obj, name)
        setattr(obj, name, value)

    def put(self, module: Any, name: str, value: Any) -> None:
        """Store ``value`` in ``module.__dict__[name]`` (a name of this module), undone by removing it again.

        Args:
            module: a module or object. name: one of this module's attribute names. value: the state.
        """
        before = module.__dict__.get(name, _ABSENT)

        def undo() -> None:
            if before is _ABSENT:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = before

        self._undo.append(undo)
        module.__dict__[name] = value

    def hook(self, handle: Any) -> Any:
        """Keep a hook's ``RemovableHandle``; undone by ``handle.remove()``. Returns the handle."""
        self._undo.append(handle.remove)
        return handle

    @contextmanager
    def hooks_registered_by(self, model: Any) -> Iterator[None]:
        """Record the forward hooks that a library call inside this context registers on ``model``'s modules without
        handing out their handles (TRL's activation offloading on the LM head); undone by removing them.

        Args:
            model: an ``nn.Module``.
        """
        before = {id(m): (set(m._forward_pre_hooks), set(m._forward_hooks)) for m in model.modules()}
        try:
            yield
        finally:  # also when the call raised half-way: what it registered is still recorded
            for m in model.modules():
                pre, post = before.get(id(m), (set(), set()))
                for key in set(m._forward_pre_hooks) - pre:
                    self._undo.append(lambda m=m, key=key: [d.pop(key, None) for d in (
                        m._forward_pre_hooks, m._forward_pre_hooks_with_kwargs)])
                for key in set(m._forward_hooks) - post:
                    self._undo.append(lambda m=m, key=key: [d.pop(key, None) for d in (
                        m._forward_hooks, m._forward_hooks_with_kwargs, m._forward_hooks_always_called)])

    def on_undo(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the changes are undone (a change made by a library call that has its own inverse)."""
        self._undo.append(fn)

    def undo(self) -> None:
        """Undo every recorded change, newest first; the journal is empty afterwards."""
        while self._undo:
            self._undo.pop()()
