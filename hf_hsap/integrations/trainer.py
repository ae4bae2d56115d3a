"""Trainer integration: ``HSAPTrainer`` (Transformers) and ``HSAPSFTTrainer`` (TRL, packing / padding-free).

The mixin changes four things and leaves the training loop alone:

1. the model runs with ``attn_implementation="hsap"`` (registered on construction);
2. the train / eval loaders are wrapped in :class:`~.dataloader.SPDataLoader`, so each SP group shares its
   global batches and every step's batch is sharded by :func:`~.sharding.shard_batch` (``hsap_plan``,
   ``shift_labels`` computed on the global batch);
3. every forward is checked to have run the plan through all of the model's attention layers
   (:func:`~.plan_use.check_plan_used`, after :func:`~.prepare.prepare_model` at construction, whose record is
   ``trainer.hsap_prepared``: ``trainer.hsap_prepared.undo()`` restores the model);
4. the loss is exact: Trainer counts valid ``shift_labels`` over all ranks (``average_tokens_across_devices``
   must stay on, its default), each rank's loss is ``sum(local CE) / N * W``, DDP averages over the ``W`` ranks. The
   logged loss (Trainer's mean over ranks) is then the loss one process would log for the same batches.
   Evaluation gets the same count through one all-reduce per batch.

Resuming (``train(resume_from_checkpoint=...)``) skips the trained batches inside the SP loader, so a
resumed run logs the losses of the uninterrupted one. What the trainers refuse at construction (label
smoothing, ``compute_loss_func``, unpacked data, conflicting Accelerate parallelism) is in
:mod:`.trainer_checks`.

Preemption (:mod:`hf_hsap.checkpoint`): checkpoints are complete only once every rank has written them (a
marker; ``save_total_limit`` rotates after it and never deletes the newest complete one);
``resume_from_checkpoint=True`` / ``"latest"`` takes the newest complete one, a partial one named explicitly is
refused. During ``train`` SIGTERM / SIGUSR1 on any rank makes every rank finish the step, save a checkpoint and
return from ``train`` with ``trainer.hsap_preempted`` True (``hsap-sft`` and the recipes then exit with
status 75).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import torch

from ..checkpoint import PREEMPTION_SIGNALS, PreemptionHandler, atomic_save, resolve_checkpoint, rotate
from ..log import get_logger
from .dataloader import SPDataLoader
from ..memory.head import find_chunked_head
from ..model_shape import text_config
from ..topology import init_sequence_parallel
from .loss import global_num_items, hsap_model_loss
from .memory_fit import check_trainer_row_fits
from .plan_use import check_plan_used
from .prepare import prepare_model
from .registry import register
from .trainer_checks import check_trainer_setup

__all__ = ["HSAPSFTTrainer", "HSAPTrainer", "HSAPTrainerMixin"]

logger = get_logger(__name__)


class HSAPTrainerMixin:
    """Mix into a ``transformers.Trainer`` subclass (put it first in the bases).

    The SP layout and planner options come, in this order, from ``hsap_config``, from ``sp`` (a group made
    elsewhere), or from ``args`` when it is an :class:`~.arguments.HSAPTrainingArguments` /
    :class:`~.arguments.HSAPSFTConfig` (``hsap_sp_size``, ...); else SP size 1.

    Args:
        sp: an :class:`~hf_hsap.SPGroup`, an int SP size, or ``None`` (from ``args`` / ``hsap_config``).
        hsap_config: an :class:`~hf_hsap.HSAPConfig` (its ``model_config`` defaults to the model's).
        preemption_signals: signals that stop ``train`` after the current step with a checkpoint (default
            SIGTERM and SIGUSR1; ``()``: none, the process keeps its own handlers).
        *args: the Trainer's own arguments.
        **kwargs: the Trainer's own keyword arguments.

    Raises:
        ValueError: what :func:`~.trainer_checks.check_trainer_setup` and :func:`~.prepare.prepare_model`
            refuse, before the first step.
    """

    def __init__(self, *args: Any, sp: Any = None, hsap_config: Any = None,
                 preemption_signals: Iterable[int] = PREEMPTION_SIGNALS, **kwargs: Any) -> None:
        register()
        train_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        _no_offloading_without_accelerator(train_args)
        offloading = bool(getattr(train_args, "activation_offloading", False))
        if offloading:  # hf_hsap's exactly sized slab (prepare_model's levers), not TRL's power-of-two pinned tensors
            train_args.activation_offloading = False
        try:
            super().__init__(*args, **kwargs)
        finally:
            if offloading:
                train_args.activation_offloading = True
        self.hsap_preempted = False  # set when a signal stopped the last train() call
        self._hsap_preemption = PreemptionHandler(preemption_signals)
        self.add_callback(_PreemptionCallback(self))
        model = self.accelerator.unwrap_model(self.model)
        config = model.config
        self._hsap_prepare_data(model)
        check_trainer_setup(self)
        self.sp, cfg = self._hsap_group(sp, hsap_config, config)
        sp = self.sp
        self.hsap_config = cfg
        # refuses before the first step what "hsap" cannot run exactly; its count checks every forward
        self.hsap_prepared = prepare_model(model, sp_size=sp.size, levers=self._hsap_levers())
        self._hsap_attention_layers = self.hsap_prepared.check.attention_layers
        self._hsap_offload = self.hsap_prepared.offload
        check_trainer_row_fits(self, model, sft=_SFTTrainer is not None and isinstance(self, _SFTTrainer))
        logger.info("hf_hsap: %s, world %d = dp %d x sp %d (ulysses %d x ring %d)", type(self).__name__,
                    self.accelerator.num_processes, sp.dp_size, sp.size, sp.ulysses_size, sp.ring_size)

    def _hsap_prepare_data(self, model: Any) -> None:
        """After the base trainer's constructor: what a subclass changes in the data path (nothing here)."""

    def _hsap_levers(self) -> Any:
        """The memory levers of ``args`` (:class:`~hf_hsap.MemoryLevers`) that :func:`~.prepare.prepare_model`
        applies to the unwrapped model.

        The Trainer enables gradient checkpointing itself (``gradient_checkpointing``). ``activation_offloading``
        (TRL's flag on ``HSAPSFTTrainer``) runs hf_hsap's :class:`~hf_hsap.memory.offload.SlabOffload` in place of
        TRL's context. ``HSAPSFTTrainer`` keeps TRL's fused LM head where its loss is not plain next-token
        cross-entropy (:meth:`_hsap_chunked_loss_fits`)."""
        from ..memory import MemoryLevers

        levers = self.args.memory_levers() if hasattr(self.args, "memory_levers") else MemoryLevers()
        return levers.replace(gradient_checkpointing=False,
                              chunked_loss=levers.chunked_loss and self._hsap_chunked_loss_fits())

    def _hsap_chunked_loss_fits(self) -> bool:
        """Whether this trainer's loss is what the chunked head computes (the Trainer's own: always)."""
        return True

    def _hsap_token_metrics(self) -> Any:
        """The token metrics the chunked head fills for this trainer's logs (``None``: none logged)."""
        return None

    def _hsap_log_token_metrics(self, metrics: Any, inputs: dict[str, Any]) -> None:
        """Log what the chunked head measured (:meth:`_hsap_token_metrics`); nothing for the Trainer."""

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Trainer's step inside the activation offloading context (``activation_offloading``)."""
        with self._hsap_offload():
            return super().training_step(*args, **kwargs)

    def _hsap_group(self, sp: Any, hsap_config: Any, model_config: Any) -> tuple[Any, Any]:
        """The SP group and the config this trainer plans with (collective when the group is created here).

        Sources, most explicit first: ``hsap_config``, else ``args`` when it is an ``HSAPTrainingArguments`` /
        ``HSAPSFTConfig``, else defaults; ``sp`` (a size or a group made by the caller) must agree with an SP
        size set in either. A caller's group is not changed, except that a group without a cost model gets the
        model's (``CostModel.from_config``) and one without a dK/dV dtype gets the config's.

        Raises:
            ValueError: ``sp`` disagrees with the SP size (or Ulysses size, or dK/dV dtype) configured.
        """
        from ..config import HSAPConfig
        from .arguments import HSAPArguments

        from_args = self.args.hsap_config(model_config) if isinstance(self.args, HSAPArguments) else None
        cfg = hsap_config or from_args or HSAPConfig()
        if cfg.model_config is None:
            cfg = cfg.replace(model_config=model_config)
        if sp is not None:  # a size or a group: it must agree with a size set in the config
            size = sp if isinstance(sp, int) else sp.size
            set_sizes = {c.sp_size for c in (hsap_config, from_args) if c is not None and c.sp_size != 1}
            if set_sizes - {size}:
                raise ValueError(f"sp={size} but the HSAP config sets sp_size={sorted(set_sizes)}; pass one of them")
        if sp is None or isinstance(sp, int):
            group = init_sequence_parallel(cfg if sp is None else cfg.replace(sp_size=sp))
            return group, group.config
        if isinstance(cfg.ulysses_size, int) and cfg.ulysses_size != sp.ulysses_size and cfg.sp_size != 1:
            raise ValueError(f"sp= has ulysses_size {sp.ulysses_size} but the HSAP config sets {cfg.ulysses_size}")
        if cfg.grad_comm_dtype is not None and sp.grad_comm_dtype not in (None, cfg.grad_comm_dtype):
            raise ValueError(f"sp= sends dK/dV in {sp.grad_comm_dtype} but the HSAP config sets {cfg.grad_comm_dtype}")
        cfg = cfg.replace(sp_size=sp.size, ulysses_size=sp.ulysses_size)
        if sp.cost_model is None:
            sp.cost_model = cfg.cost_for(sp.sap_link)  # `auto` weighs this model's KV bytes
        if sp.grad_comm_dtype is None:
            sp.grad_comm_dtype = cfg.grad_comm_dtype
        return sp, cfg

    def get_total_train_batch_size(self, args: Any) -> int:
        """Rows per optimizer step over the world: the ranks of an SP group share each row, so Trainer's
        ``micro-batch x accumulation x world`` counts every row ``sp.size`` times."""
        total = super().get_total_train_batch_size(args)
        return total // max(1, int(getattr(getattr(self, "sp", None), "size", 1)))

    def end(self) -> None:
        """Trainer's ``end`` without its gloo hang: finish the trackers, then
        :func:`~hf_hsap.topology.finish_distributed` (``accelerator.end_training`` destroys the groups while the
        DDP reducer still holds one)."""
        from ..topology import finish_distributed

        for tracker in getattr(self.accelerator, "trackers", []):
            tracker.finish()
        finish_distributed()

    def _hsap_wrap(self, loader: Any) -> SPDataLoader:
        # Trainer fetches the micro-batches of a step before their forwards: each batch's plan use is
        # checked after its own forward (compute_loss), not at the next batch
        return SPDataLoader(loader, self.sp, keep_num_items=False, config=self.hsap_config, check_previous=False)

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Trainer's ``train`` with an SP-aware resume and preemption.

        The checkpoint: ``True`` or ``"latest"``, the newest complete one in ``output_dir`` (``True`` with none
        raises, as in Trainer; ``"latest"`` with none starts at step 0); a directory, refused when partial
        (:func:`hf_hsap.checkpoint.resolve_checkpoint`). The first pass of the training loader leaves out
        the batches the checkpoint's steps trained on (:meth:`SPDataLoader.skip_first_batches`), and
        Trainer's own batch skipping (which would rebuild an unsharded per-rank loader) is turned off.
        With ``ignore_data_skip=True`` set by the caller nothing is skipped, as in Trainer.

        While it runs, the preemption signals stop training after the current step on every rank, with a
        checkpoint; ``hsap_preempted`` tells the caller (then exit with ``PREEMPTED_EXIT_CODE``)."""
        self._hsap_resume_step = 0
        self.hsap_preempted = False
        ckpt = resolve_checkpoint(self.args.output_dir, resume_from_checkpoint)
        if ckpt is None and resume_from_checkpoint is True:
            raise ValueError(f"resume_from_checkpoint=True but no complete checkpoint in {self.args.output_dir}")
        ckpt = None if ckpt is None else str(ckpt)
        with self._hsap_preemption:
            if ckpt is None or self.args.ignore_data_skip:
                return super().train(ckpt, *args, **kwargs)
            state = Path(ckpt) / "trainer_state.json"
            if not state.exists():
                raise ValueError(f"{ckpt} is not a Trainer checkpoint (no trainer_state.json)")
            self._hsap_resume_step = int(json.loads(state.read_text())["global_step"])
            logger.warning("hf_hsap: resuming at step %d; the SP loader skips the trained batches itself, so Trainer's "
                           "own data skip (ignore_data_skip) is off for this train() call", self._hsap_resume_step)
            self.args.ignore_data_skip = True  # the SP loader skips itself (get_train_dataloader)
            try:
                return super().train(ckpt, *args, **kwargs)
            finally:
                self.args.ignore_data_skip = False

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Trainer's save inside :func:`hf_hsap.checkpoint.atomic_save` (complete once every rank has written
        it), then ``save_total_limit`` by :func:`hf_hsap.checkpoint.rotate` (Trainer's best checkpoint kept)."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        path = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # no Trainer rotation before the marker
        try:
            with atomic_save(path, self.state.global_step, is_main=self.args.should_save):
                super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        if self.args.should_save and limit:
            best = self.state.best_model_checkpoint
            rotate(path.parent, limit, keep=[best] if best else [])

    def get_train_dataloader(self) -> Any:
        """The Trainer's loader, wrapped so that SP groups share global batches (length x SP size); when
        resuming, its first pass starts after the batches already trained on."""
        loader = self._hsap_wrap(super().get_train_dataloader())
        step = getattr(self, "_hsap_resume_step", 0)
        if step:
            accum = self.args.gradient_accumulation_steps
            steps_per_epoch = max(len(loader) // accum, 1)
            skip = (step % steps_per_epoch) * accum
            logger.info("hf_hsap: resuming at step %d (%d steps per epoch): the first pass of the training loader "
                        "leaves out %d batches", step, steps_per_epoch, skip)
            loader = loader.skip_first_batches(skip, first_pass_only=True)
        return loader

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """Same for evaluation."""
        return self._hsap_wrap(super().get_eval_dataloader(eval_dataset))

    def _global_num_items(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        """Valid targets over all ranks (:func:`~.loss.global_num_items`), for calls where Trainer did not
        count them (evaluation)."""
        labels = inputs.get("shift_labels")
        return None if labels is None else global_num_items(labels, self.sp)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """Trainer's (or TRL's) loss with the global target count; see the module docstring."""
        inputs.pop("num_items_in_batch", None)
        if num_items_in_batch is None:
            num_items_in_batch = self._global_num_items(inputs)
        if not return_outputs and inputs.get("shift_labels") is not None and find_chunked_head(model) is not None:
            # the chunked head (no logits); Trainer's scale: its mean over ranks is the single-process loss
            scale = self.accelerator.num_processes if self.args.average_tokens_across_devices else 1
            metrics = self._hsap_token_metrics()
            loss = hsap_model_loss(model, inputs, num_items_in_batch, grad_scale=scale, metrics=metrics)
            check_plan_used(inputs, expected_layers=getattr(self, "_hsap_attention_layers", None))
            if metrics is not None:
                self._hsap_log_token_metrics(metrics, inputs)
            return loss
        result = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                      num_items_in_batch=num_items_in_batch)
        check_plan_used(inputs, expected_layers=getattr(self, "_hsap_attention_layers", None))
        return result


def _no_offloading_without_accelerator(args: Any) -> None:
    """``activation_offloading`` moves activations from an accelerator to host memory: on CPU (``use_cpu``, or no
    accelerator) there is nothing to move, and TRL's context cannot be built there; turn it off, logged."""
    from ..memory.levers import NOTHING_TO_OFFLOAD, has_accelerator

    if getattr(args, "activation_offloading", False) and (getattr(args, "use_cpu", False) or not has_accelerator()):
        logger.info(NOTHING_TO_OFFLOAD)
        args.activation_offloading = False


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class _PreemptionCallback(_callback_base()):  # type: ignore[misc]
    """After every optimizer step, all ranks agree whether a preemption signal arrived anywhere
    (:meth:`~hf_hsap.checkpoint.PreemptionHandler.should_stop`, one all-reduce); if so they save and stop."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        trainer = self.trainer
        if trainer._hsap_preemption.should_stop(device=trainer.accelerator.device):
            trainer.hsap_preempted = state.global_step < state.max_steps
            control.should_save = True  # _maybe_log_save_evaluate saves right after this callback
            control.should_training_stop = True
        return control


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

        A vision dataset (``images`` + ``messages`` / ``prompt`` / ``completion``, as TRL takes it) with a
        vision-language model and ``packing=True``: TRL's collator processes each example alone and
        :class:`~.vision_sft.VisionPackingCollator` packs them into rows of ``max_length`` tokens (TRL's own
        ``SFTTrainer`` refuses packing for vision datasets).
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            from .vision_sft import is_vision_dataset

            sft_args = kwargs.get("args", args[1] if len(args) > 1 else None)
            data = kwargs.get("train_dataset", args[3] if len(args) > 3 else None)
            self._hsap_vision_packing = bool(is_vision_dataset(data) and sft_args is not None and
                                             (sft_args.packing or sft_args.padding_free))
            if self._hsap_vision_packing:  # TRL refuses both for vision datasets; hf_hsap packs them itself
                sft_args.packing = sft_args.padding_free = False
            try:
                super().__init__(*args, **kwargs)
            finally:
                if self._hsap_vision_packing:
                    sft_args.packing = True

        def _hsap_prepare_data(self, model: Any) -> None:
            if not getattr(self, "_hsap_vision_packing", False):
                return
            from .vision_sft import VisionPackingCollator

            self.args.packing = True
            self.padding_free = True
            self.data_collator = VisionPackingCollator(self.data_collator, model, self.args.max_length,
                                                       self.args.pad_to_multiple_of)

        def _hsap_chunked_loss_fits(self) -> bool:
            """hf_hsap's chunked loss is TRL's plain next-token loss (``loss_type="nll"``); TRL's fused LM head stays
            for the losses it computes otherwise (DFT, an MoE auxiliary loss), logged. (Label smoothing and a
            ``compute_loss_func`` are refused at construction: :mod:`.trainer_checks`.)"""
            other = [what for what, on in ((f"loss_type={self.args.loss_type!r}", self.args.loss_type != "nll"),
                                           ("the MoE auxiliary loss", bool(getattr(self, "aux_loss_enabled", False))))
                     if on]
            if other:
                logger.info("hf_hsap: %s keeps TRL's fused LM head (%s); hf_hsap's chunked loss computes the plain "
                            "next-token loss only", type(self).__name__, ", ".join(other))
            return not other

        def _hsap_token_metrics(self) -> Any:
            """TRL's logged token metrics (entropy, mean token accuracy), from the chunked head's tiles."""
            from ..memory.fused_ce import TokenMetrics

            return TokenMetrics()

        def _hsap_log_token_metrics(self, metrics: Any, inputs: dict[str, Any]) -> None:
            """Log ``entropy``, ``mean_token_accuracy`` and ``num_tokens`` as TRL's ``compute_loss`` does (sums over
            every rank, then the means)."""
            mode = "train" if self.model.training else "eval"
            gather = self.accelerator.gather_for_metrics
            valid = gather(metrics.valid.reshape(1)).sum()
            entropy = gather(metrics.entropy.detach().float().reshape(1)).sum()
            correct = gather(metrics.correct.reshape(1)).sum()
            self._metrics[mode]["entropy"].append((entropy / valid).item() if valid > 0 else 0.0)
            self._metrics[mode]["mean_token_accuracy"].append((correct / valid).item() if valid > 0 else 0.0)
            if mode == "train":  # TRL's count: a padded batch's mask, else the row's positions
                mask, positions = inputs.get("attention_mask"), inputs["position_ids"]
                # the row's last axis: multimodal rotary positions are [3 or 4, rows, tokens]
                local = mask.sum() if mask is not None else torch.tensor(positions.size(-1), device=positions.device)
                self._total_train_tokens += int(gather(local.reshape(1)).sum().item()) // self._tp_size
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]

else:  # pragma: no cover

    class HSAPSFTTrainer:  # type: ignore[no-redef]
        """Placeholder: TRL is not installed."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError("HSAPSFTTrainer needs TRL: pip install trl")
