"""Which attention layers a model's keyword arguments reach (:func:`probe_attention`), and the plan and the documents
for those they do not reach.

Under SP the ``"hsap"`` attention needs ``shard_batch``'s ``hsap_plan`` (and its ``hsap_plan_use``, ``hsap_blocks``),
which ride in the model's keyword arguments; some families' decoder layers call the attention without ``**kwargs``
(Nemotron, StableLM, Falcon). Without SP, a packed row called directly (``model(input_ids, position_ids=...)``, as
TRL's padding-free path does) shows its documents through ``position_ids`` / ``cu_seq_lens_q``; some families never
hand ``position_ids`` to their attention or their mask (the Granite-4 hybrid computes no rotary positions). Where
:func:`~.model_check.check_model`'s probe finds such layers, :func:`relay_plan` (called by ``prepare_model``)
registers forward pre-hooks on the model (and on its base model, for a direct call of it) that keep those keyword
arguments for the forward in flight (and its recomputation under gradient checkpointing), and marks those layers:
the attention reads them there when its own keyword arguments lack them. No model code is edited.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ..log import get_logger
from ..model_state import PROBE_KEY, RELAY, ModelChanges, state_of
from ..multimodal.probe import probe_inputs

logger = get_logger(__name__)

__all__ = ["PlanRelay", "Probe", "probe_attention", "relay_plan", "relayed", "relayed_documents"]

# What a relayed layer reads from the model's call: the SP plan, and the documents of a direct packed call
RELAYED_KEYS = ("hsap_plan", "hsap_plan_use", "hsap_blocks", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k")


class PlanRelay:
    """The relayed keyword arguments of a model's forward in flight (``None`` where it had none)."""

    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}
        self.outer = False  # the model's own forward is in flight (its base model's hook then leaves them alone)

    def capture(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        """Forward pre-hook of the model: kept until its next forward."""
        self.kwargs = {k: kwargs.get(k) for k in RELAYED_KEYS}
        self.outer = True

    def done(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        """Forward hook of the model (also when it raised)."""
        self.outer = False

    def capture_inner(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        """Forward pre-hook of the base model: the arguments of a call that skips the model's own forward."""
        if not self.outer:
            self.kwargs = {k: kwargs.get(k) for k in RELAYED_KEYS}


def relay_plan(model: torch.nn.Module, layers: list[torch.nn.Module], changes: ModelChanges) -> PlanRelay:
    """Give ``layers`` the plan of every forward of ``model`` (one relay per model).

    Args:
        model: the model whose forward gets ``shard_batch``'s output. layers: its attention layers the keyword
            arguments do not reach. changes: the preparation's journal (``PreparedModel.undo()`` removes the relay).

    Returns:
        The model's :class:`PlanRelay`.
    """
    relay = state_of(model, RELAY)
    if relay is None:
        relay = PlanRelay()
        changes.hook(model.register_forward_pre_hook(relay.capture, with_kwargs=True))
        changes.hook(model.register_forward_hook(relay.done, always_call=True))
        base = getattr(model, "base_model", model)
        if base is not model:  # model.model(...) called directly relays its arguments too
            changes.hook(base.register_forward_pre_hook(relay.capture_inner, with_kwargs=True))
        changes.put(model, RELAY, relay)
    for layer in layers:
        changes.put(layer, RELAY, relay)
    logger.info("relay_plan: %s: %d attention layers the kwargs do not reach get the plan and the documents from the "
                "model's forward", type(model).__name__, len(layers))
    return relay


def relayed(module: torch.nn.Module, key: str) -> Any:
    """The relayed value of ``key`` for an attention layer :func:`relay_plan` marked (``None`` otherwise)."""
    relay = state_of(module, RELAY)
    return relay.kwargs.get(key) if relay is not None else None


@dataclass(frozen=True)
class Probe:
    """What :func:`probe_attention` saw.

    Attributes:
        layers: attention layers a text forward runs.
        unreached: class names of the run layers a keyword argument of ``model(...)`` did not reach.
        accepts: whether the model takes extra keyword arguments at all.
        no_positions: class names of the run layers that got neither ``position_ids`` nor ``cu_seq_lens_q`` from a
            text call with ``position_ids`` (a direct packed call's documents would not reach them; not looked for in
            a vision-language probe).
    """

    layers: int
    unreached: tuple[str, ...]
    accepts: bool
    no_positions: tuple[str, ...] = ()


def relayed_documents(module: torch.nn.Module, rows: int, length: int
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The documents of the model's call for a relayed attention layer whose own call shows none: its
    ``(position_ids, cu_seq_lens_q, cu_seq_lens_k)``, each ``None`` unless it fits a ``[rows, length]`` call.

    Args:
        module: the attention layer. rows, length: its call's batch rows and query length.
    """
    pos, cu_q, cu_k = (relayed(module, k) for k in ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k"))
    if cu_q is not None and int(cu_q[-1]) == rows * length:
        return None, cu_q, cu_k if cu_k is not None else cu_q
    if pos is not None and pos.dim() == 2 and pos.shape[-1] == length and pos.shape[0] in (1, rows):
        return pos, None, None
    return None, None, None  # another call's (a cached generation step) or none: the layer's own inputs decide


@contextlib.contextmanager
def _attributes_kept(model: torch.nn.Module) -> Iterator[None]:
    """Every module's attributes as they were before the probe: a forward may cache what it computed on the module
    (Qwen-VL's ``rope_deltas``), and the probe must leave the model unchanged. Attributes the forward adds stay:
    they record what it set up once (Transformers' ``_output_capturing_hooks_installed`` with its hooks)."""
    saved = [(m, dict(vars(m))) for m in model.modules()]
    try:
        yield
    finally:
        for m, attrs in saved:
            for key, value in attrs.items():
                if key in m.__dict__ and m.__dict__[key] is not value:
                    m.__dict__[key] = value


def probe_attention(model: torch.nn.Module, attention: list[torch.nn.Module]) -> Probe | None:
    """Which attention layers a text forward runs, and which of them a keyword argument of ``model(...)`` (what the
    SP plan needs) or the call's ``position_ids`` (what a direct packed call's documents need) does not reach.

    One forward of two tokens (a vision-language model's: with one image between them) with a sentinel keyword
    argument (and, text only, explicit ``position_ids``), watched by pre-hooks on the attention layers: the direct
    test of "the kwargs reach every attention layer", whatever the decoder layers do.
    Layers a text forward never runs (a vision tower, cross-attention without images) are not counted.

    Returns:
        A :class:`Probe` (every layer unreached and ``accepts=False`` if the model refuses the argument), or ``None``
        when the probe cannot run (e.g. weights on the meta device; the per-step check still applies).
    """
    called: set[int] = set()
    reached: set[int] = set()
    positioned: set[int] = set()

    def hook(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        called.add(id(module))
        if PROBE_KEY in kwargs:
            reached.add(id(module))
        if kwargs.get("position_ids") is not None or kwargs.get("cu_seq_lens_q") is not None:
            positioned.add(id(module))

    try:
        param = next(model.parameters())
    except StopIteration:
        logger.info("check_model: %s has no parameters; the 2-token probe is skipped", type(model).__name__)
        return None
    if param.device.type == "meta":
        logger.info("check_model: %s has its weights on the meta device; the 2-token probe is skipped (the plan's "
                    "use is still checked after every forward)", type(model).__name__)
        return None
    if hasattr(param, "ds_id") or hasattr(param, "ds_numel"):
        # DeepSpeed ZeRO-3 partitions the weights across ranks: the bare module cannot run a forward, and
        # gathering it would defeat ZeRO-3; the trainers' per-step plan-use check still counts the layers
        logger.info("check_model: %s has ZeRO-3 partitioned weights; the 2-token probe is skipped",
                    type(model).__name__)
        return None
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in attention]
    try:  # a VLM's probe has an image
        inputs = probe_inputs(model, param.device, param.dtype)
    except Exception as e:  # noqa: BLE001 - an image this family's encoder does not take: probe with text only
        logger.info("check_model: no probe image for %s (%s: %s); the probe runs text only", type(model).__name__,
                    type(e).__name__, e)
        inputs = None
    text_only = not inputs
    if text_only:
        inputs = {"input_ids": torch.ones(1, 2, dtype=torch.long, device=param.device)}
        if "position_ids" in inspect.signature(model.forward).parameters:  # as a direct packed call passes them
            inputs["position_ids"] = torch.arange(2, device=param.device)[None]
    devices = [param.device] if param.device.type == "cuda" else []
    # on CUDA the kernels take bf16 / fp16: an fp32 model (trained under autocast) is probed under autocast too
    autocast = param.device.type == "cuda" and param.dtype in (torch.float32, torch.float64)
    try:  # the random streams stay as they were (a model with dropout would draw from them)
        with torch.no_grad(), torch.random.fork_rng(devices=devices), _attributes_kept(model), \
                torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            model(**inputs, use_cache=False, **{PROBE_KEY: True})
    except ValueError:  # "hsap" refused a layer feature (position biases, a dense mask, ...): the answer
        raise
    except TypeError as e:
        if PROBE_KEY not in str(e):
            logger.warning("check_model: could not probe %s with a 2-token forward (%s)", type(model).__name__, e)
            return None
        logger.info("check_model: %s refuses extra keyword arguments (%s)", type(model).__name__, e)
        return Probe(len(attention), tuple(sorted({type(m).__name__ for m in attention})), False)
    except Exception as e:  # noqa: BLE001 - an input the model needs besides input_ids: undecided here
        logger.warning("check_model: could not probe %s with a 2-token forward (%s: %s); the plan's use is still "
                       "checked after every forward", type(model).__name__, type(e).__name__, e)
        return None
    finally:
        for h in handles:
            h.remove()
    run = [m for m in attention if id(m) in called]
    # a vision-language probe's positions are its family's own (multimodal rotary): its documents reach the attention
    # through the mask, which the text positions build
    no_positions = {type(m).__name__ for m in run if id(m) not in positioned} if text_only else set()
    return Probe(len(called), tuple(sorted({type(m).__name__ for m in run if id(m) not in reached})), True,
                 tuple(sorted(no_positions)))
