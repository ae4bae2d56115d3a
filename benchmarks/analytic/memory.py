"""What the memory suites measure and their pages state, in one place: the pretraining recipe's two row lengths
(:mod:`benchmarks.suites.memory_levers`), the longest-row goals (:mod:`benchmarks.suites.memory_model`) and the
recipe runs the SFT memory suite compares (:mod:`benchmarks.suites.sft_memory`)."""
from __future__ import annotations

__all__ = ["RECIPE_LENGTHS", "ROW_GOALS", "ROW_GOALS_MODEL", "SFT_CHUNKED", "SFT_PRETRAIN", "SFT_TRL",
           "SFT_VARIANTS"]

RECIPE_LENGTHS = (2048, 16384)  # the recipe's short and long rows (tokens): its resident memory grows between them
ROW_GOALS_MODEL = "Llama-3-8B"
ROW_GOALS = {8: 4_000_000, 32: 16_000_000}  # Llama-3-8B on 8 / 32 H100-80GB (ALST: 3.7M / 15M)
# the SFT memory suite's runs (its results' keys, in the page's order): the pretraining recipe, the SFT recipe with
# hf_hsap's chunked loss (its default) and with TRL's fused LM head (--hsap_chunked_loss false)
SFT_PRETRAIN, SFT_CHUNKED, SFT_TRL = "pretrain", "sft chunked loss", "sft TRL fused head"
SFT_VARIANTS = (SFT_PRETRAIN, SFT_CHUNKED, SFT_TRL)
