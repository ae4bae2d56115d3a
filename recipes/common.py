"""Shared pieces of the recipes: common arguments, models (hub, local or built-in tiny configs), the
``metrics.jsonl`` writer, and the throughput numbers (TGS, MFU, peak memory).

Vocabulary used in the recipes:

* TGS: tokens per second per device = real (non-padding) tokens of the global batch / step time / number of
  processes. Every rank of an SP group holds only its shard, so TGS counts each token once.
* MFU: model FLOPs utilisation = training FLOPs of the step / step time / (processes x peak FLOP/s of one
  device). Training FLOPs = ``6 * N * tokens`` (``N`` = parameters without the input embedding) plus the
  attention ``6 * layers * heads * head_dim * sum(doc_len^2)`` (causal, per document: packed rows only attend
  inside each document). The peak comes from ``--peak_tflops`` or, on known GPUs, the dense bf16 table of
  :mod:`hf_hsap.hardware`; on CPU there is no meaningful peak, so MFU prints as ``n/a`` unless
  ``--peak_tflops`` is given.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "BUILTIN_MODELS",
    "MetricsWriter",
    "add_common_args",
    "add_memory_args",
    "attention_flops",
    "build_model",
    "check_row_fits",
    "finish_distributed",
    "guess_peak_flops",
    "init_sp",
    "load_tokenizer",
    "matmul_params",
    "memory_levers",
    "peak_memory_gb",
]

from hf_hsap.examples import BUILTIN_MODELS, builtin_config  # noqa: E402  (one table of built-in models)
from hf_hsap.topology import finish_distributed  # noqa: E402,F401  (the recipes' end of a run)

from hf_hsap.hardware import peak_flops_for_device_name  # noqa: E402  (one table of GPU peaks)


def add_common_args(parser: argparse.ArgumentParser, default_lr: float, default_max_length: int) -> None:
    """The arguments both recipes take (model, data, SP layout, steps, seed, output, throughput)."""
    g = parser.add_argument_group("common")
    g.add_argument("--model", default="tiny-llama",
                   help=f"a built-in config ({', '.join(BUILTIN_MODELS)}; random init, no download), a local "
                        "model directory or a Hub name")
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer path / Hub name (default: the shipped data/tokenizer for built-in models, "
                        "else the model's own)")
    g.add_argument("--dataset", default=None,
                   help="a datasets Hub name, a local file (.jsonl/.json/.txt/.csv/.parquet) or directory "
                        "(default: the shipped data in data/)")
    g.add_argument("--max_samples", type=int, default=None, help="use only the first N examples of the dataset")
    g.add_argument("--max_length", type=int, default=default_max_length, help="tokens per packed row")
    g.add_argument("--sp_size", type=int, default=1, help="P: ranks sharing one packed batch (divides the world)")
    g.add_argument("--ulysses_size", type=_ulysses_size, default=None,
                   help="U: all-to-all degree inside the SP group (divides P), or 'auto' (1 when the SP group "
                        "fits in one node, else the largest divisor of P that fits in a node and divides the "
                        "model's heads), or 'per_batch' (every batch at the degree the cost model prices "
                        "fastest; the default, as the recipe knows the model's heads)")
    g.add_argument("--placement", default="auto", help="token placement: auto, balanced, contiguous or zigzag")
    g.add_argument("--rounds", default="auto", choices=["auto", "batched", "by_peer"],
                   help="how SAP's transfers are grouped in time (hf_hsap.plan_sequence rounds=)")
    g.add_argument("--recv_budget_tokens", type=int, default=None,
                   help="at most this many KV tokens in one receive buffer (bounds communication memory)")
    g.add_argument("--max_steps", type=int, default=30, help="optimizer steps")
    g.add_argument("--learning_rate", type=float, default=default_lr)
    g.add_argument("--warmup_steps", type=int, default=None, help="linear warm-up steps (default: 10%% of max_steps)")
    g.add_argument("--resume_from_checkpoint", default=None,
                   help="a checkpoint-<step> directory, or 'latest' (the newest complete one; none: start at 0)")
    g.add_argument("--save_total_limit", type=positive_int, default=None,
                   help="keep only the newest N complete checkpoints (default: all; the newest is never deleted)")
    g.add_argument("--no_final_model", action="store_true", help="do not save the final model")
    g.add_argument("--weight_decay", type=float, default=0.1)
    g.add_argument("--max_grad_norm", type=float, default=1.0, help="gradient clipping (0 = off)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--output_dir", default="runs/out")
    g.add_argument("--eval_every", type=int, default=0, help="evaluate every N steps and at the end (0 = never)")
    g.add_argument("--save_every", type=int, default=0, help="save a checkpoint every N steps (0 = only at the end)")
    g.add_argument("--mixed_precision", default="auto", choices=["auto", "no", "bf16", "fp16"],
                   help="auto = bf16 on GPU, fp32 on CPU")
    g.add_argument("--report_to", default=None,
                   help="Accelerate trackers, comma-separated (tensorboard, wandb, ...); default none")
    g.add_argument("--peak_tflops", type=float, default=None,
                   help="peak TFLOP/s of one device for the MFU estimate (default: a table of GPUs; n/a on CPU)")


def add_memory_args(parser: argparse.ArgumentParser) -> None:
    """The memory levers (:class:`hf_hsap.MemoryLevers`) under the names Transformers and TRL users know."""
    from hf_hsap.memory.tiled_attention import DEFAULT_ATTENTION_TILE_TOKENS
    from hf_hsap.memory.tiled_mlp import DEFAULT_TILE_TOKENS

    g = parser.add_argument_group("memory levers")
    g.add_argument("--gradient_checkpointing", action="store_true",
                   help="recompute every decoder layer in backward (Transformers' checkpointing, non-reentrant)")
    g.add_argument("--activation_offloading", action="store_true",
                   help="keep the tensors saved for backward in host memory, copies overlapped (TRL's; CUDA only)")
    g.add_argument("--tiled_mlp", action="store_true", help="the MLPs in tiles of --mlp_tile_tokens tokens, recomputed")
    g.add_argument("--mlp_tile_tokens", type=positive_int, default=DEFAULT_TILE_TOKENS)
    g.add_argument("--recompute_norms", action="store_true",
                   help="every RMSNorm keeps only its input for the backward and is recomputed there")
    g.add_argument("--tiled_attention", action="store_true",
                   help="the single-device attention (--sp_size 1) in query tiles of --attention_tile_tokens tokens")
    g.add_argument("--attention_tile_tokens", type=positive_int, default=DEFAULT_ATTENTION_TILE_TOKENS)
    g.add_argument("--checkpoint_layers", type=positive_int, default=1,
                   help="with --gradient_checkpointing, decoder layers per checkpoint: a block keeps only its input "
                        "and recomputes all its layers in backward (default 1)")
    g.add_argument("--layers_kept_on_device", type=int, default=0,
                   help="with --activation_offloading, the last this many decoder layers' saved tensors stay on the "
                        "GPU (default 0)")
    g.add_argument("--no_chunked_loss", dest="chunked_loss", action="store_false",
                   help="materialise the full [tokens, vocab] logits (the loss is otherwise computed in tiles)")
    g.add_argument("--loss_tile_tokens", type=positive_int, default=None,
                   help="tokens of one tile of the chunked loss (default: about 16M logits per tile)")
    g.add_argument("--memory_per_device_gib", type=float, default=None,
                   help="refuse, before the first step, a --max_length whose modelled step exceeds this much memory "
                        "per device (default: the GPU's memory less 4 GiB; no check on CPU)")
    g.add_argument("--host_memory_gib", type=float, default=None,
                   help="GiB of host memory per node: refuse, before the first step, a --max_length whose host memory "
                        "(offloaded activations and optimizer, pinned buffers, each process's own) exceeds it less "
                        "10%% for the OS (default: this machine's physical memory)")


def memory_levers(args: argparse.Namespace) -> Any:
    """The :class:`hf_hsap.MemoryLevers` of :func:`add_memory_args`' flags."""
    import hf_hsap

    return hf_hsap.MemoryLevers(chunked_loss=args.chunked_loss, loss_tile_tokens=args.loss_tile_tokens,
                                gradient_checkpointing=args.gradient_checkpointing,
                                activation_offloading=args.activation_offloading, tiled_mlp=args.tiled_mlp,
                                mlp_tile_tokens=args.mlp_tile_tokens, recompute_norms=args.recompute_norms,
                                tiled_attention=args.tiled_attention,
                                attention_tile_tokens=args.attention_tile_tokens,
                                checkpoint_layers=args.checkpoint_layers,
                                layers_kept_on_device=args.layers_kept_on_device).check_counts()


# How a recipe's user turns each lever on (the advice of check_row_fits)
LEVER_FLAGS = {"chunked_loss": "the chunked loss (drop --no_chunked_loss)",
               "gradient_checkpointing": "--gradient_checkpointing", "tiled_mlp": "--tiled_mlp",
               "recompute_norms": "--recompute_norms", "tiled_attention": "--tiled_attention",
               "activation_offloading": "--activation_offloading"}


def check_row_fits(args: argparse.Namespace, config: Any, sp: Any, accelerator: Any) -> None:
    """Refuse, before the first step, a ``--max_length`` row whose modelled step (:mod:`hf_hsap.memory.model`) does
    not fit a device, naming the levers that would make it fit
    (:func:`hf_hsap.integrations.memory_fit.check_device_row_fits`). The memory: ``--memory_per_device_gib``, else
    the GPU's less 4 GiB (context, communication buffers); on CPU without the flag the device is not checked. The
    host memory of the node (``--host_memory_gib``, else this machine's) is checked everywhere."""
    from hf_hsap.integrations.memory_fit import check_device_row_fits

    half = accelerator.mixed_precision in ("bf16", "fp16")
    check_device_row_fits(accelerator, config, args.max_length, memory_gib=args.memory_per_device_gib, sp=sp,
                          levers=memory_levers(args), param_dtype="fp32", master_weights=False,
                          compute_dtype="bf16" if half else "fp32", recv_budget_tokens=args.recv_budget_tokens,
                          host_memory_gib=args.host_memory_gib,
                          spelling={**LEVER_FLAGS, "host_memory_gib": "--host_memory_gib",
                                    "offload": "the Accelerate config's offload"})


def positive_int(value: str) -> int:
    """A positive int (``--save_total_limit``)."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return n


def _ulysses_size(value: str) -> int | str:
    """``--ulysses_size``: a positive int, ``auto`` or ``per_batch`` (``HSAPConfig``'s modes)."""
    from hf_hsap.config import ULYSSES_MODES

    if value in ULYSSES_MODES:
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, 'auto' or 'per_batch', got {value!r}") from None


def init_sp(args: argparse.Namespace) -> Any:
    """``hf_hsap.init_sequence_parallel`` with the :class:`~hf_hsap.HSAPConfig` of ``--sp_size``,
    ``--ulysses_size``, ``--placement``, ``--rounds`` and ``--recv_budget_tokens`` (collective; after the process
    group exists). The model's config (read without building the model) gives ``auto`` its query heads and the
    planner its cost model."""
    import hf_hsap

    if args.model in BUILTIN_MODELS:
        from types import SimpleNamespace

        config = SimpleNamespace(**BUILTIN_MODELS[args.model][1])
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(args.model)
    return hf_hsap.init_sequence_parallel(hf_hsap.HSAPConfig(
        sp_size=args.sp_size, ulysses_size=args.ulysses_size, placement=args.placement, rounds=args.rounds,
        recv_budget_tokens=args.recv_budget_tokens, model_config=config))


def load_tokenizer(model: str, tokenizer: str | None) -> Any:
    """The tokenizer: ``tokenizer`` if given, the shipped one for built-in models, else the model's own."""
    from transformers import AutoTokenizer

    from hf_hsap.data import tokenizer_path

    if tokenizer is None:
        tokenizer = str(tokenizer_path()) if model in BUILTIN_MODELS else model
    tok = AutoTokenizer.from_pretrained(tokenizer)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def build_model(name: str, vocab_size: int, max_length: int, seed: int) -> torch.nn.Module:
    """A causal LM with ``attn_implementation="hsap"``, float32 weights (autocast does bf16).

    Args:
        name: a key of :data:`BUILTIN_MODELS` (random init from ``seed``), or a path / Hub name
            (``from_pretrained``).
        vocab_size: the tokenizer's size (built-in configs only).
        max_length: tokens per packed row (built-in configs get at least this many positions).
        seed: initialisation seed, the same on every rank.

    Returns:
        The model in train mode.
    """
    import hf_hsap  # registers "hsap"
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    if name in BUILTIN_MODELS:
        config = builtin_config(name, vocab_size, max_length)
        hf_hsap.check_config(config)  # before construction: some families cannot even be built with "hsap"
        model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap", dtype=torch.float32)
    else:
        hf_hsap.check_config(AutoConfig.from_pretrained(name))
        model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="hsap", dtype=torch.float32)
    return model.train()


def n_params(params: Any) -> int:
    """Elements of ``params``, counted whole also when ZeRO-3 partitioned them at construction (``ds_numel``)."""
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in params)


def matmul_params(model: torch.nn.Module) -> int:
    """``N`` of ``6 * N * tokens``: all parameters except the input embedding (a lookup, not a matmul)."""
    emb = model.get_input_embeddings()
    skip = {id(p) for p in emb.parameters()} if emb is not None else set()
    out = model.get_output_embeddings()
    tied = out is not None and emb is not None and out.weight is emb.weight
    n = n_params(p for p in model.parameters() if id(p) not in skip)
    return n + (n_params([out.weight]) if tied else 0)  # a tied LM head still costs a matmul


def attention_flops(config: Any, sum_sq_doc_lens: int) -> float:
    """Causal attention FLOPs of forward + backward over documents with ``sum(len^2) = sum_sq_doc_lens``."""
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return 6.0 * int(config.num_hidden_layers) * heads * head_dim * float(sum_sq_doc_lens)


def guess_peak_flops(device: torch.device, peak_tflops: float | None) -> float | None:
    """Peak FLOP/s of one device.

    Args:
        device: the training device.
        peak_tflops: ``--peak_tflops`` (TFLOP/s), or None.

    Returns:
        ``peak_tflops`` in FLOP/s if given, else the dense bf16 peak of a known GPU from
        :mod:`hf_hsap.hardware` (by its ``torch.cuda.get_device_name``), else None (CPU, unknown GPU).
    """
    if peak_tflops:
        return peak_tflops * 1e12
    if device.type == "cuda":
        return peak_flops_for_device_name(torch.cuda.get_device_name(device))
    return None


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process in GiB: CUDA max allocated on GPU, peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


class MetricsWriter:
    """``<output_dir>/metrics.jsonl``: one JSON object per optimizer step, written by the main process.

    Args:
        output_dir: the run directory (created).
        enabled: False on every process but the main one.
        resume_step: keep only the records of steps ``<= resume_step`` already in the file (a resumed run
            rewrites the steps after its checkpoint); ``None`` starts a new file.
    """

    def __init__(self, output_dir: str | os.PathLike[str], enabled: bool, resume_step: int | None = None) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[str] = []
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (flushed at once, so a crash keeps every finished step)."""
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def resolve_checkpoint(output_dir: str, spec: str | None) -> Path | None:
    """The checkpoint to resume from: None, the newest *complete* one for 'latest' (None on a first run), or
    ``spec`` itself, refused when partial (:func:`hf_hsap.checkpoint.resolve_checkpoint`)."""
    from hf_hsap.checkpoint import resolve_checkpoint as resolve

    return resolve(output_dir, spec)


def parse_common_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, then fill the defaults that depend on other arguments (warm-up = 10% of the steps)."""
    args = parser.parse_args(argv)
    if args.warmup_steps is None:
        args.warmup_steps = max(1, args.max_steps // 10)
    return args
