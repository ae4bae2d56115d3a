"""Trainer integration: ``HSAPTrainer`` (Transformers) and ``HSAPSFTTrainer`` (TRL, packing / padding-free).

The mixin changes four things and leaves the training loop alone:

1. the model runs with ``attn_implementation="hsap"`` (registered on construction);
2. the train / eval loaders are wrapped in :class:`~.dataloader.SPDataLoader`, so each SP group shares its
   global batches and every step's batch is sharded by :func:`~.sharding.shard_batch` (``hsap_plan``,
   ``shift_labels`` computed on the global batch);
3. every forward is checked to have run the plan through all of the model's attention layers
   (:func:`~.plan_use.check_plan_used`, after :func:`~.model_check.check_model` at construction);
4. the loss is exact: Trainer counts valid ``shift_labels`` over all ranks (``average_tokens_across_devices``
   is forced on), each rank's loss is ``sum(local CE) / N * W``, DDP averages over the ``W`` ranks. The
   logged loss (Trainer's mean over ranks) is then the loss one process would log for the same batches.
   Evaluation gets the same count through one all-reduce per batch.

Resuming (``train(resume_from_checkpoint=...)``) skips the trained batches inside the SP loader, so a
resumed run logs the losses of the uninterrupted one. Label smoothing is refused: ``shift_labels`` are
already shifted and Trainer's smoother would shift again.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .dataloader import SPDataLoader
from .model_check import check_model
from .plan_use import check_plan_used
from .sharding import IGNORE_INDEX
from .transformers import ATTN_NAME, register

__all__ = ["HSAPSFTTrainer", "HSAPTrainer", "HSAPTrainerMixin"]


class HSAPTrainerMixin:
    """Mix into a ``transformers.Trainer`` subclass (put it first in the bases).

    Args:
        sp: an :class:`~hf_hsap.SPGroup`, an int SP size (the group is created after the Accelerator, i.e.
            collectively on every rank, with ``ulysses_size="auto"`` for the model's heads), or ``None``
            for SP size 1 (plain data parallelism with "hsap"). A group without a ``cost_model`` gets
            ``CostModel.from_config(model.config, sp.sap_link)``.
        sp_placement: placement passed to the planner (``"auto"``).
        sp_plan_options: further keyword arguments of :func:`hf_hsap.plan_sequence` for every batch
            (``recv_budget_tokens`` to bound communication buffers, ``rounds``, ``token_slack``, ``cost``).
        *args, **kwargs: the Trainer's own arguments.
    """

    def __init__(self, *args: Any, sp: Any = None, sp_placement: str = "auto",
                 sp_plan_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        register()
        super().__init__(*args, **kwargs)
        from .. import CostModel, init_sequence_parallel

        config = self.accelerator.unwrap_model(self.model).config
        if sp is None or isinstance(sp, int):
            sp = init_sequence_parallel(sp or 1, num_heads=getattr(config, "num_attention_heads", None))
        if sp.cost_model is None and hasattr(config, "num_attention_heads") and hasattr(config, "hidden_size"):
            sp.cost_model = CostModel.from_config(config, sp.sap_link)  # `auto` weighs this model's KV bytes
        self.sp = sp
        self.sp_placement = sp_placement
        self.sp_plan_options = dict(sp_plan_options or {})
        if self.args.label_smoothing_factor:
            raise ValueError("HSAP trainers pass pre-shifted labels; set label_smoothing_factor=0 (label smoothing "
                             "would shift them again)")
        self.args.average_tokens_across_devices = True  # the exact-loss contract relies on the global count
        model = self.accelerator.unwrap_model(self.model)
        if getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
            model.set_attn_implementation(ATTN_NAME)
        # refuse before the first step what "hsap" cannot run exactly; the count checks every forward
        self._hsap_attention_layers = check_model(model, sp_size=sp.size).attention_layers

    def _hsap_wrap(self, loader: Any) -> SPDataLoader:
        # Trainer fetches the micro-batches of a step before their forwards: each batch's plan use is
        # checked after its own forward (compute_loss), not at the next batch
        return SPDataLoader(loader, self.sp, placement=self.sp_placement, keep_num_items=False,
                            plan_options=self.sp_plan_options, check_previous=False)

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Trainer's ``train`` with an SP-aware resume: the first pass of the training loader leaves out
        the batches the checkpoint's steps trained on (:meth:`SPDataLoader.skip_first_batches`), and
        Trainer's own batch skipping (which would rebuild an unsharded per-rank loader) is turned off.
        With ``ignore_data_skip=True`` set by the caller nothing is skipped, as in Trainer."""
        self._hsap_resume_step = 0
        if resume_from_checkpoint and not self.args.ignore_data_skip:
            ckpt = resume_from_checkpoint
            if ckpt is True:
                from transformers.trainer_utils import get_last_checkpoint

                ckpt = get_last_checkpoint(self.args.output_dir)
                if ckpt is None:
                    raise ValueError(f"resume_from_checkpoint=True but no checkpoint in {self.args.output_dir}")
            state = Path(ckpt) / "trainer_state.json"
            if not state.exists():
                raise ValueError(f"{ckpt} is not a Trainer checkpoint (no trainer_state.json)")
            self._hsap_resume_step = int(json.loads(state.read_text())["global_step"])
            self.args.ignore_data_skip = True  # the SP loader skips itself (get_train_dataloader)
            try:
                return super().train(resume_from_checkpoint, *args, **kwargs)
            finally:
                self.args.ignore_data_skip = False
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def get_train_dataloader(self) -> Any:
        """The Trainer's loader, wrapped so that SP groups share global batches (length x SP size); when
        resuming, its first pass starts after the batches already trained on."""
        loader = self._hsap_wrap(super().get_train_dataloader())
        step = getattr(self, "_hsap_resume_step", 0)
        if step:
            accum = self.args.gradient_accumulation_steps
            steps_per_epoch = max(len(loader) // accum, 1)
            loader = loader.skip_first_batches((step % steps_per_epoch) * accum, first_pass_only=True)
        return loader

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """Same for evaluation."""
        return self._hsap_wrap(super().get_eval_dataloader(eval_dataset))

    def _global_num_items(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        """Valid targets over all ranks (one all-reduce), for calls where Trainer did not count them."""
        labels = inputs.get("shift_labels")
        if labels is None:
            return None
        count = (labels != IGNORE_INDEX).sum().to(torch.int64)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(count)
        return count

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """Trainer's (or TRL's) loss with the global target count; see the module docstring."""
        inputs.pop("num_items_in_batch", None)
        if num_items_in_batch is None:
            num_items_in_batch = self._global_num_items(inputs)
        result = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                      num_items_in_batch=num_items_in_batch)
        check_plan_used(inputs, expected_layers=getattr(self, "_hsap_attention_layers", None))
        return result


def _trainer_class() -> type:
    from transformers import Trainer

    return Trainer


class HSAPTrainer(HSAPTrainerMixin, _trainer_class()):  # type: ignore[misc]
    """``transformers.Trainer`` with HSAP sequence parallelism (see :class:`HSAPTrainerMixin`)."""


try:  # TRL is optional
    from trl import SFTTrainer as _SFTTrainer
except ImportError:  # pragma: no cover - exercised only without TRL
    _SFTTrainer = None

if _SFTTrainer is not None:

    class HSAPSFTTrainer(HSAPTrainerMixin, _SFTTrainer):  # type: ignore[misc]
        """TRL ``SFTTrainer`` with HSAP sequence parallelism.

        Use ``SFTConfig(packing=True)`` (BFD packing, padding-free: batches carry ``position_ids`` and
        ``cu_seq_lens_q``) or ``padding_free=True``; padded batches are refused by :func:`shard_batch`.
        """

else:  # pragma: no cover

    class HSAPSFTTrainer:  # type: ignore[no-redef]
        """Placeholder: TRL is not installed."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError("HSAPSFTTrainer needs TRL: pip install trl")
