"""Deterministic step data for the pretraining recipe: step -> documents -> packed micro-batches.

The data of optimizer step ``s`` is a pure function of ``(seed, s)``, never of the number of processes::

    documents   : epoch e visits the training documents in randperm(seed, e); the global stream is
                  epoch 0, epoch 1, ...; step s takes stream positions [s * D, (s + 1) * D)   (D = docs_per_step)
    micro-batches: the D documents are dealt to dp_size * grad_accum bins, longest first, each to the bin
                  with the fewest tokens (deterministic); DP group g trains bins [g * A, (g + 1) * A)
    packing     : each bin is packed by PackingCollator into rows of max_length tokens (the global batch of
                  that micro-step, identical on every rank of the SP group)

Every rank computes its own SP group's micro-batches itself, so no data has to be sent and resuming at step
``s`` is exact by construction: the data position of a checkpoint is its step. The loss of a step does not
depend on how its documents are grouped into bins (attention never crosses a document and the loss is
normalised by the step's global target count), so SP and DP sizes change neither the data nor the loss.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hf_hsap.data import IGNORE_INDEX, PackingCollator
from hf_hsap.integrations import batch_cu_seqlens, shift_labels_global

__all__ = ["MicroBatch", "StepData", "deal_documents", "split_train_eval"]



def split_train_eval(n_docs: int, eval_docs: int, seed: int) -> tuple[list[int], list[int]]:
    """Hold out ``eval_docs`` documents chosen by ``seed``: ``(train indices, eval indices)``, both sorted."""
    if not 0 <= eval_docs < n_docs:
        raise ValueError(f"--eval_docs={eval_docs} must be in [0, {n_docs}) (the dataset has {n_docs} documents)")
    perm = torch.randperm(n_docs, generator=torch.Generator().manual_seed(seed + 7919)).tolist()
    return sorted(perm[eval_docs:]), sorted(perm[:eval_docs])


def deal_documents(lengths: list[int], n_bins: int) -> list[list[int]]:
    """Deal documents to ``n_bins`` bins, longest first, each to the bin with the fewest tokens so far.

    Args:
        lengths: token count of each document.
        n_bins: number of bins (micro-batches of all DP groups of one step).

    Returns:
        ``n_bins`` lists of positions into ``lengths``; ties go to the lowest bin / position.

    Raises:
        ValueError: fewer documents than bins (a micro-batch would be empty).
    """
    if len(lengths) < n_bins:
        raise ValueError(f"{len(lengths)} documents per step cannot fill {n_bins} micro-batches (dp_size x "
                         "grad_accum); raise --docs_per_step or lower --grad_accum")
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    load = [0] * n_bins
    for pos in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        b = min(range(n_bins), key=lambda j: (load[j], j))
        bins[b].append(pos)
        load[b] += lengths[pos]
    return bins


@dataclass
class MicroBatch:
    """One packed global batch and its counts.

    Attributes:
        batch: PackingCollator output (``input_ids / labels / position_ids [B, L]``, ``cu_seq_lens_q``).
        targets: valid next-token targets in the batch (the loss normaliser's share).
        tokens: real (non-padding) tokens.
        sum_sq: sum of squared document (piece) lengths, for the attention FLOPs.
    """

    batch: dict[str, Any]
    targets: int
    tokens: int
    sum_sq: int


@dataclass
class StepData:
    """The packed micro-batches of every step of one DP group.

    Args:
        dataset: tokenized dataset with an ``input_ids`` column (``hf_hsap.data.tokenize_corpus``).
        train_indices: dataset rows to train on.
        docs_per_step: D, documents in the global batch of one optimizer step.
        collator: the packing collator (rows of ``max_length`` tokens).
        seed: the data order seed.
    """

    dataset: Any
    train_indices: list[int]
    docs_per_step: int
    collator: PackingCollator
    seed: int
    _perms: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def _epoch_order(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            self._perms.clear()  # one epoch at a time is enough: steps are visited in order
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(len(self.train_indices), generator=g).tolist()
            self._perms[epoch] = [self.train_indices[i] for i in perm]
        return self._perms[epoch]

    def step_documents(self, step: int) -> list[int]:
        """Dataset rows of the global batch of optimizer step ``step`` (0-based), in stream order."""
        n = len(self.train_indices)
        rows = []
        for pos in range(step * self.docs_per_step, (step + 1) * self.docs_per_step):
            rows.append(self._epoch_order(pos // n)[pos % n])
        return rows

    def epoch_of(self, step: int) -> float:
        """Epochs done at the end of ``step`` (for the logs)."""
        return (step + 1) * self.docs_per_step / len(self.train_indices)

    def micro_batches(self, step: int, dp_size: int, dp_rank: int, grad_accum: int) -> list[MicroBatch]:
        """The ``grad_accum`` packed global batches of DP group ``dp_rank`` at step ``step``."""
        rows = self.step_documents(step)
        examples = self.dataset[rows]["input_ids"]  # list of token lists, in `rows` order
        bins = deal_documents([len(x) for x in examples], dp_size * grad_accum)
        out = []
        for b in bins[dp_rank * grad_accum:(dp_rank + 1) * grad_accum]:
            docs = [examples[i] for i in sorted(b)]
            batch = self.collator([{"input_ids": d} for d in docs])
            targets = shift_labels_global(batch["labels"], batch_cu_seqlens(batch))  # [B*L]
            pieces = [p for d in docs for p in _piece_lengths(len(d), self.collator.max_length)]
            out.append(MicroBatch(batch=batch, targets=int((targets != IGNORE_INDEX).sum()),
                                  tokens=sum(pieces), sum_sq=sum(p * p for p in pieces)))
        return out


def _piece_lengths(n: int, max_length: int) -> list[int]:
    """Lengths of the pieces PackingCollator cuts a document of ``n`` tokens into (``overflow="split"``)."""
    return [min(max_length, n - s) for s in range(0, n, max_length)]
