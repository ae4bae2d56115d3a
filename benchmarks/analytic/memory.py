"""What the memory suites measure and their pages state, in one place: the pretraining recipe's two row lengths
(:mod:`benchmarks.suites.memory_levers`) and the longest-row goals (:mod:`benchmarks.suites.memory_model`)."""
from __future__ import annotations

__all__ = ["RECIPE_LENGTHS", "ROW_GOALS", "ROW_GOALS_MODEL"]

RECIPE_LENGTHS = (2048, 16384)  # the recipe's short and long rows (tokens): its resident memory grows between them
ROW_GOALS_MODEL = "Llama-3-8B"
ROW_GOALS = {8: 4_000_000, 32: 16_000_000}  # Llama-3-8B on 8 / 32 H100-80GB (ALST: 3.7M / 15M)
