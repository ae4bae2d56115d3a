"""What the memory suites measure and their pages state, in one place: the pretraining recipe's two row lengths
(:mod:`benchmarks.suites.memory_levers`), the longest-row goals (:mod:`benchmarks.suites.memory_model`) and the
recipe runs the SFT memory suite compares (:mod:`benchmarks.suites.sft_memory`)."""
from __future__ import annotations

__all__ = ["RECIPE_LENGTHS", "ROW_GOALS", "SFT_CHUNKED", "SFT_PRETRAIN", "SFT_TRL", "SFT_VARIANTS"]

RECIPE_LENGTHS = (2048, 16384)  # the recipe's short and long rows (tokens): its resident memory grows between them
# the predicted longest row, every lever on, the host memory of a DGX-H100 node counted, by (model, H100-80GB count)
# (ALST: Llama-8B 500K on 1, 3.7M on 8, 15M on 32)
ROW_GOALS = {("Llama-3-8B", 1): 1_000_000, ("Llama-3-8B", 8): 6_000_000, ("Llama-3-8B", 32): 16_000_000,
             ("Llama-3-70B", 8): 1_000_000}
# the SFT memory suite's runs (its results' keys, in the page's order): the pretraining recipe, the SFT recipe with
# hf_hsap's chunked loss (its default) and with TRL's fused LM head (--hsap_chunked_loss false)
SFT_PRETRAIN, SFT_CHUNKED, SFT_TRL = "pretrain", "sft chunked loss", "sft TRL fused head"
SFT_VARIANTS = (SFT_PRETRAIN, SFT_CHUNKED, SFT_TRL)
