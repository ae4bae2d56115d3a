"""HSAP options where Hugging Face users already configure: ``TrainingArguments`` / ``SFTConfig`` subclasses.

The ``hsap_*`` fields are ordinary dataclass fields, so ``HfArgumentParser``, TRL's ``TrlParser`` (and its
``--config file.yaml``), the command line and Python all carry them::

    args = HSAPSFTConfig(output_dir="out", packing=True, hsap_sp_size=4, hsap_ulysses_size="2")
    trainer = HSAPSFTTrainer(model=model, args=args, train_dataset=data)   # SP 4 read from args

    hsap-sft --model_name_or_path ... --packing --hsap_sp_size 4 --hsap_recv_budget_tokens 8192

Each field mirrors one of :class:`~hf_hsap.HSAPConfig` (``hsap_sp_size`` -> ``sp_size``, ...); validation
happens once, in ``__post_init__`` (through ``HSAPConfig``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import TrainingArguments

from ..config import DEFAULT_TIMEOUT_S, PLACEMENTS, RECURRENT_MODES, ROUNDS, HSAPConfig
from ..memory.levers import MemoryLevers
from ..memory.tiled_attention import DEFAULT_ATTENTION_TILE_TOKENS
from ..memory.tiled_mlp import DEFAULT_TILE_TOKENS
from ..plan.placement import DEFAULT_TOKEN_SLACK

__all__ = ["HSAPArguments", "HSAPSFTConfig", "HSAPTrainingArguments", "HSAP_FIELDS"]

HSAP_FIELDS = ("sp_size", "ulysses_size", "placement", "rounds", "recv_budget_tokens", "token_slack",
               "grad_comm_dtype", "timeout_s", "gpus_per_node", "per_batch_memory_cap", "recurrent_mode")


@dataclass
class HSAPArguments:
    """The HSAP fields (mixed into :class:`HSAPTrainingArguments` and :class:`HSAPSFTConfig`)."""

    hsap_sp_size: int = field(default=1, metadata={
        "help": "HSAP: ranks sharing one packed batch (sequence parallel size; divides the number of processes)"})
    hsap_ulysses_size: str | None = field(default=None, metadata={
        "help": "HSAP: Ulysses all-to-all degree inside the SP group (divides hsap_sp_size and the heads), "
                "'auto' (1 inside one node, else Ulysses inside each node) or 'per_batch' (every batch at the degree "
                "the cost model prices fastest within hsap_per_batch_memory_cap); default: per_batch when the "
                "model's heads are known (the trainers pass its config), else auto"})
    hsap_placement: str = field(default="auto", metadata={"help": f"HSAP: token placement, one of {PLACEMENTS}"})
    hsap_rounds: str = field(default="auto", metadata={"help": f"HSAP: SAP round order, one of {ROUNDS}"})
    hsap_recv_budget_tokens: int | None = field(default=None, metadata={
        "help": "HSAP: at most this many KV tokens in one receive buffer (bounds communication memory)"})
    hsap_token_slack: float = field(default=DEFAULT_TOKEN_SLACK, metadata={
        "help": "HSAP: extra tokens a rank may hold over ceil(T/P), as a fraction (balanced placement)"})
    hsap_grad_comm_dtype: str | None = field(default=None, metadata={
        "help": "HSAP: dtype of the dK/dV partial sums sent back (default: the inputs' dtype; e.g. float32)"})
    hsap_timeout_s: float = field(default=DEFAULT_TIMEOUT_S, metadata={
        "help": "HSAP: seconds before a silent peer makes the SP group raise"})
    hsap_gpus_per_node: int | None = field(default=None, metadata={
        "help": "HSAP: ranks per node (default LOCAL_WORLD_SIZE)"})
    hsap_per_batch_memory_cap: bool = field(default=True, metadata={
        "help": "HSAP: with hsap_ulysses_size per_batch, no batch at a degree whose modelled activation memory "
                "exceeds the highest degree's (False: the fastest degree by time alone)"})
    hsap_recurrent_mode: str = field(default="auto", metadata={
        "help": "HSAP: how a hybrid's recurrent layers run a document split over ranks, one of "
                f"{RECURRENT_MODES}: summaries (every rank at once, one exchange of fixed-size summaries per layer), "
                "heads (an all-to-all to head shards, whole documents per rank) or auto (the cost model's choice)"})

    hsap_chunked_loss: bool = field(default=True, metadata={
        "help": "HSAP: the LM head and the loss in tiles, never the full logits (HSAPSFTTrainer: TRL's entropy and "
                "mean token accuracy from the same tiles; TRL's fused LM head where its loss is not plain NLL)"})
    hsap_loss_tile_tokens: int | None = field(default=None, metadata={
        "help": "HSAP: tokens of one tile of the chunked loss (default: about 16M logits per tile)"})
    hsap_tiled_mlp: bool = field(default=False, metadata={
        "help": "HSAP: every dense MLP in tiles of hsap_mlp_tile_tokens tokens, recomputed in backward"})
    hsap_mlp_tile_tokens: int = field(default=DEFAULT_TILE_TOKENS, metadata={"help": "HSAP: tokens of one MLP tile"})
    hsap_memory_per_device_gib: float | None = field(default=None, metadata={
        "help": "HSAP: refuse before the first step a max_length x per_device_train_batch_size row whose modelled step "
                "exceeds this much memory per device (default: the GPU's memory less 4 GiB; no check on CPU)"})
    hsap_host_memory_gib: float | None = field(default=None, metadata={
        "help": "HSAP: GiB of host memory per node; refuse before the first step a row whose host memory (offloaded "
                "activations and optimizer, pinned buffers, each process's own) exceeds it less a tenth for the OS "
                "(default: this machine's physical memory)"})
    hsap_recompute_norms: bool = field(default=False, metadata={
        "help": "HSAP: every RMSNorm keeps only its input for the backward and is recomputed there"})
    hsap_tiled_attention: bool = field(default=False, metadata={
        "help": "HSAP: the single-device attention (SP 1) in query tiles of hsap_attention_tile_tokens tokens, "
                "its backward's buffers one tile at a time"})
    hsap_attention_tile_tokens: int = field(default=DEFAULT_ATTENTION_TILE_TOKENS, metadata={
        "help": "HSAP: query tokens of one tile of the tiled attention"})

    hsap_checkpoint_layers: int = field(default=1, metadata={
        "help": "HSAP: with gradient_checkpointing, decoder layers per checkpoint: a block keeps only its input and "
                "recomputes all its layers in backward"})
    hsap_layers_kept_on_device: int = field(default=0, metadata={
        "help": "HSAP: with activation_offloading, the last this many decoder layers' saved tensors stay on the GPU"})

    def memory_levers(self) -> MemoryLevers:
        """The :class:`~hf_hsap.MemoryLevers` of these arguments (checkpointing and offloading from the Trainer's /
        TRL's own ``gradient_checkpointing`` and ``activation_offloading``)."""
        return MemoryLevers(chunked_loss=self.hsap_chunked_loss, loss_tile_tokens=self.hsap_loss_tile_tokens,
                            gradient_checkpointing=bool(getattr(self, "activation_checkpointing", None)
                                                        or getattr(self, "gradient_checkpointing", False)),
                            activation_offloading=bool(getattr(self, "activation_offloading", False)),
                            tiled_mlp=self.hsap_tiled_mlp, mlp_tile_tokens=self.hsap_mlp_tile_tokens,
                            recompute_norms=self.hsap_recompute_norms, tiled_attention=self.hsap_tiled_attention,
                            attention_tile_tokens=self.hsap_attention_tile_tokens,
                            checkpoint_layers=self.hsap_checkpoint_layers,
                            layers_kept_on_device=self.hsap_layers_kept_on_device).check_counts()

    def hsap_config(self, model_config: Any = None) -> HSAPConfig:
        """The :class:`~hf_hsap.HSAPConfig` of these arguments (validated).

        Args:
            model_config: the model's Transformers config (the planner's cost model and ``"auto"`` U).
        """
        return HSAPConfig(**{name: getattr(self, f"hsap_{name}") for name in HSAP_FIELDS}, model_config=model_config)


@dataclass
class HSAPTrainingArguments(HSAPArguments, TrainingArguments):
    """``transformers.TrainingArguments`` plus the ``hsap_*`` fields of :class:`HSAPArguments`, and TRL's
    ``activation_offloading`` (the name TRL users know; ``SFTConfig`` has it already)."""

    activation_offloading: bool = field(default=False, metadata={
        "help": "move the tensors saved for backward to one exactly sized pinned host slab on a side stream "
                "(hf_hsap's SlabOffload; CUDA only)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.hsap_config()
        self.memory_levers()  # validate once, where the user configured


def _sft_config_class() -> type | None:
    try:
        from trl import SFTConfig
    except ImportError:  # pragma: no cover - TRL is optional
        return None
    return SFTConfig


_SFTConfig = _sft_config_class()

if _SFTConfig is not None:

    @dataclass
    class HSAPSFTConfig(HSAPArguments, _SFTConfig):  # type: ignore[misc,valid-type]
        """TRL ``SFTConfig`` plus the ``hsap_*`` fields of :class:`HSAPArguments`."""

        def __post_init__(self) -> None:
            super().__post_init__()
            self.hsap_config()
            self.memory_levers()

else:  # pragma: no cover

    class HSAPSFTConfig:  # type: ignore[no-redef]
        """Placeholder: TRL is not installed."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError("HSAPSFTConfig needs TRL: pip install trl")
