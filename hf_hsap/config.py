"""HSAPConfig: every HSAP option in one frozen, validated object.

One object travels from where users configure (``HSAPTrainingArguments`` / ``HSAPSFTConfig``, the
``hsap-sft`` command line, a recipe's flags) to the group (:func:`~hf_hsap.init_sequence_parallel`), the
sharding hook, the SP data loader, the trainers and ``hsap-plan``::

    cfg = HSAPConfig(sp_size=4, ulysses_size=2, recv_budget_tokens=8192, model_config=model.config)
    sp = hf_hsap.init_sequence_parallel(cfg)            # groups + the model's cost model
    local = hf_hsap.shard_batch(batch, sp)              # placement, rounds, budget: from sp.config
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .model_shape import text_config
from .plan.placement import DEFAULT_TOKEN_SLACK, PLACEMENTS
from .plan.windows import Window, layer_windows

__all__ = ["HSAPConfig", "PLACEMENTS", "ROUNDS", "ULYSSES_MODES", "attention_windows", "parse_dtype",
           "resolve_ulysses_size", "text_config"]

logger = logging.getLogger(__name__)

ROUNDS = ("auto", "batched", "by_peer")
RECURRENT_MODES = ("auto", "summaries", "heads")
VISION_ENCODINGS = ("auto", "holders", "once")  # how a vision item split across SP ranks is encoded
ULYSSES_MODES = ("auto", "per_batch")  # the non-int values of ulysses_size
DEFAULT_TIMEOUT_S = 600.0
_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "half": torch.float16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
           "fp64": torch.float64, "float64": torch.float64}


def parse_dtype(value: Any) -> torch.dtype | None:
    """A dtype from a ``torch.dtype``, its name (``"bf16"``, ``"float32"``, ``"torch.float32"``) or None.

    Raises:
        ValueError: an unknown name.
    """
    if value is None or isinstance(value, torch.dtype):
        return value
    name = str(value).lower().removeprefix("torch.")
    if name in ("", "none", "auto"):
        return None
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {value!r}; use one of {sorted(_DTYPES)} or None")
    return _DTYPES[name]


@dataclass(frozen=True, eq=False)
class HSAPConfig:
    """What HSAP needs to know, validated once at construction.

    Args:
        sp_size: P, ranks sharing one packed batch (divides the world).
        ulysses_size: U, the all-to-all degree inside the SP group (divides P and the query heads),
            ``"auto"`` (one degree by the node rule, :func:`~hf_hsap.topology.auto_ulysses_size`) or
            ``"per_batch"`` (groups for every degree that divides P, the heads and a node; every batch runs
            the degree whose plan the cost model prices fastest, :func:`hf_hsap.sp_plan.plan_per_batch`).
            ``None`` (default): ``"per_batch"`` when the model's query heads are known (``model_config`` or
            ``num_heads``), else ``"auto"`` (:func:`resolve_ulysses_size`).
        per_batch_memory_cap: with ``"per_batch"``, a batch runs only at a degree whose modelled activation memory
            per rank is at most the highest degree's (:func:`hf_hsap.plan.degree.fastest_degree`; flat SAP keeps its
            received keys for the backward); ``False``: the fastest degree, whatever it holds.
        placement: token placement of the planner (``auto``, ``balanced``, ``contiguous``, ``density``, ``zigzag``).
        rounds: how SAP's transfers are grouped in time (``auto``, ``batched``, ``by_peer``).
        recv_budget_tokens: at most this many KV tokens in one receive buffer (None: no bound).
        token_slack: epsilon of the balanced token cap ``ceil(T/P) * (1 + eps)``.
        grad_comm_dtype: dtype of the dK/dV partial sums SAP returns (None: the inputs' dtype); a dtype or
            its name (``"float32"``).
        timeout_s: collective / point-to-point timeout of the SP groups.
        gpus_per_node: ranks per node (None: ``LOCAL_WORLD_SIZE``, else the GPUs, else the world).
        cost_model: the planner's :class:`~hf_hsap.CostModel` (None: built from ``model_config``).
        model_config: a Transformers config; with no ``cost_model`` the group's cost model is
            ``CostModel.from_config(model_config, sp.sap_link, detect_hardware())`` and ``"auto"`` U divides its heads;
            with no ``windows``, its layers' sliding windows are what plans are made for.
        windows: the attention mask of every layer (``plan_sequence(..., windows=...)``: a per-layer list of
            sliding windows, ``None`` = full attention, or a mapping window -> layer count); None: read from
            ``model_config`` (:func:`hf_hsap.attention_windows`), else full attention only.
        recurrent_mode: how a hybrid's recurrent layers run split documents under SP: ``"summaries"`` (every rank
            runs its runs at once, one exchange of fixed-size summaries per layer), ``"heads"`` (an all-to-all to
            head shards, whole documents per rank, where the heads divide the group; other kernels take summaries)
            or ``"auto"`` (per batch, the one the plan's cost model prices faster: :func:`hf_hsap.plan.cost.recurrent_mode`).
            Read from the SP group's config (``init_sequence_parallel``), for every batch it runs.
        vision_encoding: how an image or video whose placeholders are split across SP ranks is encoded:
            ``"holders"`` (every holder encodes it whole), ``"once"`` (one holder encodes it and sends the others
            their feature rows) or ``"auto"`` (per batch, the cheaper on the busiest rank:
            :func:`hf_hsap.multimodal.exchange.route_items`). Read by ``shard_batch``.
        vision_balance: ``placement="auto"`` weighs each image's or video's encoder work on the rank that encodes it,
            so the busiest rank's encoder plus decoder work is balanced (:mod:`hf_hsap.plan.items`); ``False``:
            the plan weighs the decoder alone. Read by ``shard_batch``.

    Raises:
        ValueError: any field out of range (named, with the values it accepts).
    """

    sp_size: int = 1
    ulysses_size: int | str | None = None
    placement: str = "auto"
    rounds: str = "auto"
    recv_budget_tokens: int | None = None
    token_slack: float = DEFAULT_TOKEN_SLACK
    grad_comm_dtype: Any = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    gpus_per_node: int | None = None
    cost_model: Any = None
    model_config: Any = field(default=None, repr=False)
    windows: Any = None
    per_batch_memory_cap: bool = True
    recurrent_mode: str = "auto"
    vision_encoding: str = "auto"
    vision_balance: bool = True

    def __post_init__(self) -> None:
        def bad(name: str, what: str) -> ValueError:
            return ValueError(f"HSAPConfig.{name}={getattr(self, name)!r}: {what}")

        if isinstance(self.ulysses_size, str) and self.ulysses_size.isdigit():
            object.__setattr__(self, "ulysses_size", int(self.ulysses_size))
        try:
            object.__setattr__(self, "grad_comm_dtype", parse_dtype(self.grad_comm_dtype))
        except ValueError as err:
            raise bad("grad_comm_dtype", str(err)) from None
        for name in ("token_slack", "timeout_s"):
            try:
                object.__setattr__(self, name, float(getattr(self, name)))
            except (TypeError, ValueError):
                raise bad(name, "must be a number") from None
        if isinstance(self.sp_size, bool) or not isinstance(self.sp_size, int) or self.sp_size < 1:
            raise bad("sp_size", "must be a positive int")
        u = self.ulysses_size
        if u is not None and u not in ULYSSES_MODES and (isinstance(u, bool) or not isinstance(u, int) or u < 1):
            raise bad("ulysses_size", f"must be a positive int, one of {ULYSSES_MODES} or None (the default)")
        if isinstance(u, int) and self.sp_size % u:
            raise bad("ulysses_size", f"does not divide sp_size={self.sp_size}; pick a divisor (e.g. the GPUs per node)")
        if self.placement not in PLACEMENTS:
            raise bad("placement", f"must be one of {PLACEMENTS}")
        if self.recurrent_mode not in RECURRENT_MODES:
            raise bad("recurrent_mode", f"must be one of {RECURRENT_MODES}")
        if self.vision_encoding not in VISION_ENCODINGS:
            raise bad("vision_encoding", f"must be one of {VISION_ENCODINGS}")
        if self.rounds not in ROUNDS:
            raise bad("rounds", f"must be one of {ROUNDS}")
        if self.recv_budget_tokens is not None and (isinstance(self.recv_budget_tokens, bool)
                                                    or not isinstance(self.recv_budget_tokens, int)
                                                    or self.recv_budget_tokens < 1):
            raise bad("recv_budget_tokens", "must be a positive int or None")
        if not 0 <= float(self.token_slack) <= 1:
            raise bad("token_slack", "must lie in [0, 1]")
        if not float(self.timeout_s) > 0:
            raise bad("timeout_s", "must be > 0 seconds")
        if self.windows is not None:
            try:
                object.__setattr__(self, "windows", layer_windows(self.windows))
            except (TypeError, ValueError) as err:
                raise bad("windows", f"{err} (a per-layer list of windows, None = full attention, or a mapping "
                                     "window -> layers)") from None
        for name in ("per_batch_memory_cap", "vision_balance"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "must be True or False")
        if self.gpus_per_node is not None and (isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int)
                                               or self.gpus_per_node < 1):
            raise bad("gpus_per_node", "must be a positive int or None")

    def replace(self, **changes: Any) -> "HSAPConfig":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def num_heads(self) -> int | None:
        """Query heads of ``model_config``'s decoder (:func:`text_config`; what ``ulysses_size="auto"`` /
        ``"per_batch"`` degrees divide), or None."""
        return getattr(text_config(self.model_config), "num_attention_heads", None)

    @property
    def num_kv_heads(self) -> int | None:
        """Key/value heads of ``model_config``'s decoder (``num_key_value_heads``, else its query heads), or None."""
        return getattr(text_config(self.model_config), "num_key_value_heads", None) or self.num_heads

    def cost_for(self, sap_link: str) -> Any:
        """The cost model of a group whose SAP links are ``sap_link``: ``cost_model``, else one built from
        ``model_config`` (when it has the shapes) for this process's GPU
        (:func:`hf_hsap.devices.detect_hardware`), else None (the planner's default)."""
        if self.cost_model is not None:
            return self.cost_model
        cfg = text_config(self.model_config)
        if cfg is not None and hasattr(cfg, "num_attention_heads") and hasattr(cfg, "hidden_size"):
            from .devices import detect_hardware
            from .plan.cost import CostModel

            return CostModel.from_config(cfg, sap_link, detect_hardware())
        return None

    def plan_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`hf_hsap.plan_sequence` (besides ``placement``; the cost model
        travels on the group)."""
        options = {"rounds": self.rounds, "recv_budget_tokens": self.recv_budget_tokens,
                   "token_slack": float(self.token_slack)}
        windows = self.windows
        if windows is None and self.model_config is not None:
            windows = attention_windows(self.model_config)
        if windows is not None:
            options["windows"] = windows
        return options


def attention_windows(config: Any) -> list[Window]:
    """The sliding window of every attention layer of a Transformers config (``None``: full), for
    ``plan_sequence(..., windows=...)``; one entry when the config has no layer count.

    Read as the layers read it, attributes only: ``layer_types`` (``"sliding_attention"`` layers have
    ``sliding_window``), else ``sliding_window`` on every layer unless ``use_sliding_window`` is False; composite
    configs use their text config. A layer that differs at run time is still exact, only not weighed by ``auto``.
    """
    config = text_config(config)
    window = getattr(config, "sliding_window", None)
    window = window if isinstance(window, (int, np.integer)) and not isinstance(window, bool) and window >= 1 else None
    n_layers = getattr(config, "num_hidden_layers", None)
    types = getattr(config, "layer_types", None)
    if types:
        types = list(types)[:n_layers] if isinstance(n_layers, int) else list(types)
        return [window if str(t) == "sliding_attention" else None for t in types]
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    return [window] * (n_layers if isinstance(n_layers, int) and n_layers > 0 else 1)


def resolve_ulysses_size(ulysses_size: int | str | None, num_heads: int | None, sp_size: int) -> int | str:
    """The degree option a group is built with: ``ulysses_size`` as given, or for the default (``None``)
    ``"per_batch"`` when the model's query heads are known and ``"auto"`` otherwise. Why: with the heads known,
    every batch can run at the degree the cost model prices fastest, from flat SAP up to Ulysses itself; the cost
    is a set of process groups per degree and one plan per degree for every new layout (cached like any plan).

    Args:
        ulysses_size: the option (an int, ``"auto"``, ``"per_batch"`` or None). num_heads: query heads, or None.
        sp_size: P (a group of one rank has one degree: ``"auto"``).

    Returns:
        An int, ``"auto"`` or ``"per_batch"``.
    """
    if ulysses_size is not None:
        return ulysses_size
    chosen = "per_batch" if num_heads and sp_size > 1 else "auto"
    if sp_size > 1:
        logger.info("hf_hsap: ulysses_size not set: %r (%s)", chosen,
                    f"the model has {num_heads} query heads" if num_heads else "the model's heads are unknown")
    return chosen
