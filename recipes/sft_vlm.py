"""Supervised fine-tuning of a vision-language model with TRL and HSAP: packed image + text rows under SP.

    accelerate launch --config_file accelerate_configs/cpu_4proc.yaml recipes/sft_vlm.py \
        --hsap_sp_size 4 --hsap_ulysses_size 2 --max_steps 10
    python recipes/sft_vlm.py --max_steps 10                             # the same losses on one process
    python recipes/sft_vlm.py --model qwen2_5_vl --max_steps 10          # another built-in tiny VLM of TRL's set
    python recipes/sft_vlm.py --model_name_or_path path/to/vlm --dataset_name path/to/dataset

A thin wrapper of ``hsap-sft`` (:mod:`hf_hsap.cli.sft`, TRL's own ``sft`` script with ``HSAPSFTTrainer``): TRL
loads the checkpoint with its architecture (``LlavaForConditionalGeneration``, ``Qwen2VLForConditionalGeneration``,
...) and its processor, its ``DataCollatorForVisionLanguageModeling`` processes each example (chat template, image
placeholders, assistant-only labels) and ``HSAPSFTTrainer`` packs the documents into rows of ``--max_length`` tokens
(TRL's own ``SFTTrainer`` refuses ``packing`` for vision datasets); under SP each rank encodes only the images whose
placeholders it holds. Every flag but ``--train_rows`` is an ``hsap-sft`` flag; the recipe's defaults come first,
the user's win:

* ``--model``: a built-in tiny random VLM of TRL's SFT examples and docs (:data:`hf_hsap.examples.TRL_VLMS`:
  ``llava`` (default), ``llava_next``, ``mllama``, ``smolvlm``, ``gemma3``, ``qwen2_5_vl``, ``qwen3_vl``,
  ``mistral3``), saved with its own processor by :func:`hf_hsap.examples.save_tiny_vlm` to
  ``<output_dir>/base_model``; the trainer gets that processor as built (Transformers loads SmolVLM's and
  Qwen-VL's with torchvision only). ``--model_name_or_path`` instead: a checkpoint of any family that
  :func:`hf_hsap.vision_spec` accepts (the others are refused before the first step);
* ``--dataset_name``: a directory of ``datasets.save_to_disk`` (written as Parquet to ``<output_dir>/data``, which
  ``load_dataset`` reads), or anything ``load_dataset`` reads (rows with ``images`` + ``messages``); default the
  generated shapes set of :func:`hf_hsap.examples.vlm.vlm_sft_rows` (``--train_rows`` rows, no download);
* ``--packing`` and ``--assistant_only_loss`` on, ``--max_length 512`` (a LLaVA-NeXT document of three images is
  314 tokens), 8 examples per micro-batch, one line and one ``<output_dir>/metrics.jsonl`` record per step (loss,
  grad_norm, lr);
* at the end one line (and ``<output_dir>/packing.json``) with what the trained rows held: documents, images and
  trained tokens per packed row; TRL's script then saves the model to ``--output_dir``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # recipes/ helpers when launched as a script

import hf_hsap  # noqa: E402,F401  (registers the "hsap" attention)
from hf_hsap.checkpoint import PREEMPTED_EXIT_CODE  # noqa: E402
from hf_hsap.cli.sft import make_parser, run as run_sft  # noqa: E402
from hf_hsap.data import IGNORE_INDEX  # noqa: E402
from hf_hsap.examples import TRL_VLMS  # noqa: E402
from hf_hsap.integrations import HSAPSFTTrainer  # noqa: E402
from hf_hsap.log import get_logger  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from common import MetricsWriter, finish_distributed  # noqa: E402

logger = get_logger("hf_hsap.recipes.sft_vlm")
STATS = ("batches", "rows", "documents", "images", "trained_tokens")  # the packing counters, in this order


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The flags the recipe reads itself, and all of ``argv`` for ``hsap-sft`` (nothing is taken out).

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        ``(recipe flags, argv)``.
    """
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llava", choices=list(TRL_VLMS),
                   help="the built-in tiny VLM to train when no --model_name_or_path is given (default: llava)")
    p.add_argument("--model_name_or_path", default=None, help="a VLM directory or Hub name (default: --model)")
    p.add_argument("--dataset_name", default=None,
                   help="a save_to_disk directory or a load_dataset name / directory (default: the generated set)")
    p.add_argument("--train_rows", type=int, default=64, help="rows of the generated set (default data only)")
    p.add_argument("--output_dir", default="runs/sft_vlm")
    p.add_argument("--seed", type=int, default=0)
    argv = list(sys.argv[1:] if argv is None else argv)
    args, _ = p.parse_known_args(argv)
    return args, argv


def hsap_sft_argv(args: argparse.Namespace, argv: list[str], model: str, data: str) -> list[str]:
    """The ``hsap-sft`` command line: the recipe's defaults, then the user's flags (the last one wins).

    Args:
        args: :func:`parse_args`' flags; argv: the user's command line; model / data: what
            :func:`prepare_inputs` made (they replace the user's ``--model_name_or_path`` / ``--dataset_name``).

    Returns:
        The argument list for :func:`hf_hsap.cli.sft.make_parser`.
    """
    cuda = torch.cuda.is_available()
    defaults = [
        "--output_dir", args.output_dir, "--seed", str(args.seed), "--data_seed", str(args.seed),
        "--packing", "--assistant_only_loss", "true", "--max_length", "512", "--max_steps", "10",
        "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1",
        "--learning_rate", "2e-3", "--lr_scheduler_type", "cosine", "--warmup_steps", "0",
        "--logging_steps", "1", "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
        "--bf16", str(cuda), "--use_cpu", str(not cuda), "--dataloader_num_workers", "0",
        "--hsap_sp_size", "1",
    ]
    return defaults + _without(argv, ("--model", "--model_name_or_path", "--dataset_name", "--train_rows")) + [
        "--model_name_or_path", model, "--dataset_name", data]


def _without(argv: list[str], flags: Sequence[str]) -> list[str]:
    """``argv`` less ``flags`` and their values (``--flag value`` or ``--flag=value``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif a.split("=", 1)[0] not in flags:
            out.append(a)
    return out


def _is_saved_to_disk(path: str) -> bool:
    """Whether ``path`` is a ``Dataset`` / ``DatasetDict`` directory of ``save_to_disk``."""
    d = Path(path)
    return d.is_dir() and ((d / "state.json").exists() or (d / "dataset_dict.json").exists())


def prepare_inputs(args: argparse.Namespace, main_process: bool) -> tuple[str, str]:
    """The model (``--model``'s built-in tiny VLM saved once, or the user's) and the dataset (Parquet splits, or
    the user's).

    Args:
        args: :func:`parse_args`' flags; main_process: write files (the other ranks wait, then read them).

    Returns:
        ``(--model_name_or_path, --dataset_name)`` for ``hsap-sft``.
    """
    from hf_hsap.examples import save_tiny_vlm, vlm_sft_rows

    out = Path(args.output_dir)
    model = args.model_name_or_path or str(out / "base_model")
    data = args.dataset_name
    if data is not None and not _is_saved_to_disk(data):
        if main_process:
            logger.info("sft_vlm: --dataset_name %s goes to load_dataset as it is", data)
    else:
        data = str(out / "data")
    if not main_process:
        return model, data
    if args.model_name_or_path is None:
        logger.info("sft_vlm: no --model_name_or_path: the tiny random %s (seed %d) saved to %s",
                    TRL_VLMS[args.model], args.seed, model)
        save_tiny_vlm(model, args.model, seed=args.seed)
    if args.dataset_name is None or _is_saved_to_disk(args.dataset_name):
        from datasets import Dataset, DatasetDict, load_from_disk

        if args.dataset_name is None:
            logger.info("sft_vlm: no --dataset_name: %d generated image + text rows (seed %d) as %s/train.parquet",
                        args.train_rows, args.seed, data)
            splits: Any = DatasetDict(train=Dataset.from_list(vlm_sft_rows(args.train_rows, seed=args.seed)))
        else:
            logger.info("sft_vlm: %s was written by save_to_disk; its splits go to %s as Parquet (TRL's script "
                        "reads --dataset_name with load_dataset)", args.dataset_name, data)
            splits = load_from_disk(args.dataset_name)
            splits = splits if isinstance(splits, DatasetDict) else DatasetDict(train=splits)
        Path(data).mkdir(parents=True, exist_ok=True)
        for old in Path(data).glob("*.parquet"):
            old.unlink()
        for name, split in splits.items():
            split.to_parquet(str(Path(data) / f"{name}.parquet"))
    return model, data


def count_images(examples: Sequence[Mapping[str, Any]]) -> int:
    """The images of a batch's examples (TRL's ``images`` list or single ``image``): a vision document is never
    cut, so a packed batch holds exactly these, whatever the family's pixel layout (tiles, patches, a batch axis)."""
    return sum(len(ex["images"] or ()) if "images" in ex else int(ex.get("image") is not None) for ex in examples)


def batch_stats(examples: Sequence[Any], batch: Mapping[str, Any], images: int) -> list[int]:
    """One packed batch's counters, in the order of :data:`STATS`.

    Args:
        examples: the collator's input (one document each); batch: its packed output; images: the examples'
            images (:func:`count_images`, before TRL's collator rewrites the examples).

    Returns:
        ``[1, rows, documents, images, trained tokens]``.
    """
    rows = int(batch["input_ids"].shape[0])
    return [1, rows, len(examples), images, int((batch["labels"] != IGNORE_INDEX).sum())]


class CountingCollator:
    """The trainer's collator, recording :func:`batch_stats` of every batch it packs, in order.

    Args:
        collate: the collator to wrap (``HSAPSFTTrainer``'s vision packing collator).
    """

    def __init__(self, collate: Callable[[Sequence[Any]], dict[str, Any]]) -> None:
        self.collate = collate
        self.batches: list[list[int]] = []

    def __call__(self, examples: Sequence[Any]) -> dict[str, Any]:
        """Pack ``examples`` with the wrapped collator and record the batch's counters."""
        images = count_images(examples)
        batch = self.collate(examples)
        self.batches.append(batch_stats(examples, batch, images))
        return batch


class VLMRecipeTrainer(HSAPSFTTrainer):  # type: ignore[misc,valid-type]
    """``HSAPSFTTrainer`` that counts what its trained rows held (:meth:`packing_totals`).

    Args:
        *args, **kwargs: ``HSAPSFTTrainer``'s arguments.
    """

    builtin_processor: Any = None  # the built-in tiny VLM's processor (--model), given to TRL as processing_class

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if self.builtin_processor is not None and kwargs.get("processing_class") is None:
            kwargs["processing_class"] = self.builtin_processor
        super().__init__(*args, **kwargs)
        self.row_counter = CountingCollator(self.data_collator)
        self.data_collator = self.row_counter
        self.micro_batches = 0  # SP batches this rank trained on (one per training_step)

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        """Count the SP batch, then train on it."""
        self.micro_batches += 1
        return super().training_step(model, inputs, num_items_in_batch)

    def packing_totals(self) -> dict[str, int]:
        """The counters of every batch trained on, over all ranks (collective under a process group).

        The loader collates one batch ahead, so this rank's list is cut to the batches trained on: the SP loader
        gathers one batch from each SP rank and yields them in SP rank order, so after ``k`` SP batches rank
        ``r`` of ``P`` contributed ``ceil((k - r) / P)``. Every batch is collated on exactly one rank.

        Returns:
            ``{name: total}`` over :data:`STATS`.
        """
        size, rank = int(self.sp.size), int(self.sp.rank)
        mine = max(0, -(-(self.micro_batches - rank) // size))
        totals = torch.tensor([sum(col) for col in zip(*self.row_counter.batches[:mine])] or [0] * len(STATS),
                              dtype=torch.int64, device=self.accelerator.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(totals)
        return dict(zip(STATS, (int(x) for x in totals.tolist())))


class StepLogCallback(TrainerCallback):
    """One printed line and one ``metrics.jsonl`` record per optimizer step; at the end of training the packing
    line and ``packing.json``. Every process runs it (the end's all-reduce is collective).

    Args:
        trainer: the :class:`VLMRecipeTrainer`; writer: the metrics file (enabled on the main process only).
    """

    def __init__(self, trainer: VLMRecipeTrainer, writer: MetricsWriter) -> None:
        self.trainer, self.writer = trainer, writer

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        """A step's training log (``loss`` in ``logs``): its record and, on the main process, its line."""
        logs = logs or {}
        if "loss" not in logs:
            return
        record = {"step": state.global_step, "loss": logs["loss"], "grad_norm": logs.get("grad_norm"),
                  "lr": logs.get("learning_rate")}
        self.writer.write(record)
        if state.is_world_process_zero:
            print(f"step {record['step']:>4}/{state.max_steps} | loss {record['loss']:.4f} | "
                  f"grad_norm {float(record['grad_norm'] or 0):.3f} | lr {float(record['lr'] or 0):.2e}", flush=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The packing totals (every rank: an all-reduce); the main process prints them and writes the JSON."""
        totals = self.trainer.packing_totals()
        if not state.is_world_process_zero:
            return
        rows = max(totals["rows"], 1)
        summary = {**totals, "row_length": int(self.trainer.args.max_length),
                   "documents_per_row": totals["documents"] / rows, "images_per_row": totals["images"] / rows,
                   "trained_tokens_per_row": totals["trained_tokens"] / rows}
        (Path(args.output_dir) / "packing.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(f"[hf_hsap] packed rows: {totals['rows']} rows of {summary['row_length']} tokens in "
              f"{totals['batches']} batches | {summary['documents_per_row']:.2f} documents, "
              f"{summary['images_per_row']:.2f} images, {summary['trained_tokens_per_row']:.1f} trained tokens "
              f"per row", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Prepare the model and data, then run ``hsap-sft`` with the step log (see the module docstring).

    Args:
        argv: the command line (default ``sys.argv[1:]``).
    """
    from accelerate import PartialState

    args, argv = parse_args(argv)
    state = PartialState(cpu=not torch.cuda.is_available())  # the process group, before the SP groups
    with state.main_process_first():
        model, data = prepare_inputs(args, state.is_main_process)
    parsed = make_parser().parse_args_and_config(args=hsap_sft_argv(args, argv, model, data),
                                                 fail_with_unknown_args=True)
    training_args = parsed[1]
    if not training_args.packing:
        raise ValueError("recipes/sft_vlm.py packs vision rows: drop --packing false (use hsap-sft for unpacked data)")
    writer = MetricsWriter(training_args.output_dir, state.is_main_process)
    if state.is_main_process:
        print(f"[hf_hsap] VLM SFT: world {state.num_processes}, sp {training_args.hsap_sp_size} "
              f"(ulysses {training_args.hsap_ulysses_size or 'default'}) | model {model} | data {data} | rows of "
              f"{training_args.max_length} tokens | assistant-only loss {training_args.assistant_only_loss}",
              flush=True)
    trainer_class = VLMRecipeTrainer
    if args.model_name_or_path is None:  # the built-in model: its processor as built here, not from_pretrained
        from hf_hsap.examples import tiny_trl_processor

        trainer_class = type("VLMRecipeTrainer", (VLMRecipeTrainer,),
                             {"builtin_processor": tiny_trl_processor(args.model)})
    trainer = run_sft(*parsed, callbacks=[lambda t: StepLogCallback(t, writer)], trainer_class=trainer_class)
    finish_distributed()
    if trainer.hsap_preempted:
        sys.exit(PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
    main()
