"""The kernel interface: varlen attention forward -> (out, lse), backward -> (dq, dk, dv).

Vocabulary (fixed for the whole package):

* A *varlen call* runs attention over several independent segments packed along the token axis.
  Segment ``i`` has queries ``q[cu_q[i]:cu_q[i+1]]`` and keys/values ``k[cu_k[i]:cu_k[i+1]]``.
* ``causal=True`` means *bottom-right aligned* causal masking (as flash-attn >= 2.1): with ``Lq``
  queries and ``Lk`` keys, query ``i`` sees keys ``j <= i + Lk - Lq``. For ``Lq == Lk`` this is the
  usual lower-triangular mask.
* ``window_left`` (``None``: no window) is flash-attn's left window, bottom-right aligned like
  ``causal``: query ``i`` also needs ``j >= i + Lk - Lq - window_left``. Together with ``causal`` it is
  flash-attn's ``window_size=(window_left, 0 if causal else -1)``. Transformers' ``sliding_window``
  converts to it with :func:`window_left` (the one place that conversion lives).
* ``softcap`` (``None``: off), Gemma 2's logit soft-capping: a score is ``softcap * tanh(scale * q.k /
  softcap)``; the lse is that of the capped scores (merging partial results is unchanged).
* ``lse`` is the natural-log log-sum-exp of the scaled scores of each (query, head): shape
  ``[Nq, Hq]``, float32 (float64 when the inputs are float64). A query with no visible key has
  ``lse = -inf`` and output 0.
* GQA: ``Hq`` must be a multiple of ``Hkv``; query head ``h`` reads key/value head ``h // (Hq // Hkv)``.
  Kernels never materialise repeated key/value heads.

Optional in-place capability (:class:`InPlaceKernel`, the CPU kernel has it): ``forward_into`` /
``backward_into`` take *segments* as row ranges anywhere in un-gathered q and k/v
(:data:`Segment`) and merge the output into / add the gradients to caller-owned accumulators, so
the runtime needs no row gathers, scatters or gradient buffers per work item.

Calls pass the tensors positionally and the rest by keyword: ``forward(q, k, v, spec, scale)``,
``backward(dout, q, k, v, out, lse, spec=, scale=)``, ``forward_into(q, k, v, segments=, causal=, scale=,
out=, lse=)``, ``backward_into(dout, q, k, v, out, lse, segments=, causal=, scale=, dq=, dk=, dv=)``.

Backward contract (what makes split attention exact): ``backward`` receives the *final* output and
log-sum-exp of each query (after all partial results were merged), not the partial ones of this call.
Then the gradients of every partial call add up to the gradient of the whole attention.
"""
from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch


@dataclass(frozen=True)
class VarlenSpec:
    """Segment boundaries of one varlen call (plain ints: plans live on the CPU).

    Args:
        cu_q: cumulative query lengths, ``len = n_segments + 1``, starting at 0.
        cu_k: cumulative key lengths, same length as ``cu_q``.
        causal: bottom-right aligned causal mask inside each segment, else full attention.
        window_left: flash-attn's left window (``>= 0``, bottom-right aligned, see the module docstring),
            ``None``: no window.
    """

    cu_q: tuple[int, ...]
    cu_k: tuple[int, ...]
    causal: bool
    window_left: int | None = None
    _device_cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        w = self.window_left
        if w is None:
            return
        try:
            as_int = operator.index(w)
        except TypeError:
            as_int = -1
        if isinstance(w, bool) or as_int < 0:
            raise ValueError(f"window_left must be an int >= 0 or None, got {w!r} (convert Transformers' "
                             "sliding_window with hf_hsap.kernels.base.window_left)")
        object.__setattr__(self, "window_left", as_int)  # numpy integers as plain ints

    @property
    def n_segments(self) -> int:
        return len(self.cu_q) - 1

    @property
    def total_q(self) -> int:
        return self.cu_q[-1]

    @property
    def total_k(self) -> int:
        return self.cu_k[-1]

    @property
    def max_q(self) -> int:
        return max((b - a for a, b in zip(self.cu_q, self.cu_q[1:])), default=0)

    @property
    def max_k(self) -> int:
        return max((b - a for a, b in zip(self.cu_k, self.cu_k[1:])), default=0)

    def segments(self) -> Sequence[tuple[int, int, int, int]]:
        """``(q_start, q_end, k_start, k_end)`` of every segment."""
        return list(zip(self.cu_q, self.cu_q[1:], self.cu_k, self.cu_k[1:]))

    def cu_tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """int32 ``cu_q``, ``cu_k`` on ``device`` (cached: built once per device)."""
        key = str(device)
        if key not in self._device_cache:
            self._device_cache[key] = (
                torch.tensor(self.cu_q, dtype=torch.int32, device=device),
                torch.tensor(self.cu_k, dtype=torch.int32, device=device),
            )
        return self._device_cache[key]

    @staticmethod
    def from_lengths(q_lens: Sequence[int], k_lens: Sequence[int], causal: bool,
                     window_left: int | None = None) -> "VarlenSpec":
        """Build a spec from per-segment lengths (``window_left`` as in :class:`VarlenSpec`)."""
        if len(q_lens) != len(k_lens):
            raise ValueError("q_lens and k_lens must have one entry per segment")
        cu_q, cu_k = [0], [0]
        for lq, lk in zip(q_lens, k_lens):
            cu_q.append(cu_q[-1] + int(lq))
            cu_k.append(cu_k[-1] + int(lk))
        return VarlenSpec(tuple(cu_q), tuple(cu_k), causal, window_left)


def check_features(kernel: AttentionKernel, window_left: int | None, softcap: float | None) -> None:
    """Refuse a window or soft-capping on a kernel that does not declare them (``supports_window`` /
    ``supports_softcap`` class attributes): a kernel written to the older contract would read only
    ``spec.causal`` and compute another attention without an error.

    Args:
        kernel: the kernel. window_left: the call's window (``None``: none). softcap: its soft-cap.

    Raises:
        ValueError: naming the missing feature and a kernel that has it.
    """
    for what, used, flag in (("sliding windows", window_left is not None, "supports_window"),
                             ("logit soft-capping", softcap is not None, "supports_softcap")):
        if used and not getattr(kernel, flag, False):
            raise ValueError(
                f"kernel {getattr(kernel, 'name', type(kernel).__name__)!r} does not declare {what} ({flag} = True); "
                "use one of hf_hsap's kernels that has it (select_kernel(...); on CUDA, soft-capping needs flash-attn >= "
                "2.7), or implement the feature and set the flag")


def window_left(window: int | None) -> int | None:
    """Transformers' ``sliding_window`` as flash-attn's left window (the one place this conversion lives).

    Args:
        window: a query sees the ``window`` keys ending at itself (``masking_utils``: ``kv_idx > q_idx -
            sliding_window``), ``None``: no window.

    Returns:
        ``window - 1`` (the keys left of the query's own position it still sees), ``None`` for ``None``.

    Raises:
        ValueError: ``window`` is not an int ``>= 1``.
    """
    if window is None:
        return None
    try:
        as_int = operator.index(window)  # ints and numpy integers, not floats
    except TypeError:
        as_int = None
    if isinstance(window, bool) or as_int is None or as_int < 1:
        raise ValueError(f"a sliding window must be an int >= 1 (tokens a query sees, itself included) or None, "
                         f"got {window!r}")
    window = as_int
    return window - 1


Segment = tuple[int, int, int, int]  # (q_lo, q_hi, k_lo, k_hi): rows of q and of k/v (not packed)


class AttentionKernel(Protocol):
    """A varlen attention implementation (see the module docstring for the contract). The mask of a call
    is the spec's (``causal``, ``window_left``); ``softcap`` caps the scores (``None``: off)."""

    name: str

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float, *,
        softcap: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Args: q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]``. Returns out ``[Nq, Hq, D]`` (q's dtype) and
        lse ``[Nq, Hq]`` (see :func:`lse_dtype`)."""
        ...

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        *,
        spec: VarlenSpec,
        scale: float,
        softcap: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Args: dout/out ``[Nq, Hq, D]``, lse ``[Nq, Hq]`` (final, merged values).
        Returns dq ``[Nq, Hq, D]``, dk/dv ``[Nk, Hkv, D]`` (inputs' dtypes)."""
        ...


class InPlaceKernel(AttentionKernel, Protocol):
    """A kernel that also runs segments in place (see the module docstring). Within one call the
    segments are independent attention problems, each with the call's mask (``causal``, ``window_left``,
    bottom-right aligned within the segment); several may share query rows (their results are merged)
    or key rows (their gradients add up)."""

    def forward_into(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, segments: Sequence[Segment], causal: bool,
        scale: float, out: torch.Tensor, lse: torch.Tensor, fresh: bool = False,
        window_left: int | None = None, softcap: float | None = None,
    ) -> None:
        """Merge the attention of every segment into ``out`` / ``lse`` by log-sum-exp (in place).

        Args:
            q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]``: un-gathered sources of the segments' rows.
            out ``[Nq, Hq, D]`` and lse ``[Nq, Hq]``: accumulators in :func:`lse_dtype`.
            fresh: the segments' query rows hold nothing yet (their first result is written, not merged;
                a row that sees no key of any segment is left as it is: 0 / ``-inf`` when so initialised).
        """
        ...

    def backward_into(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, *, segments: Sequence[Segment], causal: bool, scale: float,
        dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
        window_left: int | None = None, softcap: float | None = None,
    ) -> None:
        """Add the segments' gradients to ``dq [Nq, Hq, D]``, ``dk``/``dv [Nk, Hkv, D]`` (in place; any
        dtype, views allowed). ``out``/``lse``: the final merged values of all ``Nq`` rows."""
        ...


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of log-sum-exp and of merge accumulators: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec) -> None:
    """Raise ``ValueError`` when tensors do not match the varlen spec or GQA is impossible."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [tokens, heads, head_dim]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k head_dim differ: {q.shape[2]} vs {k.shape[2]}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"the number of query heads ({q.shape[1]}) must be a multiple of the number of key/value "
            f"heads ({k.shape[1]}); fix the model config (num_key_value_heads)"
        )
    if q.shape[0] != spec.total_q or k.shape[0] != spec.total_k:
        raise ValueError(f"varlen spec covers {spec.total_q} queries / {spec.total_k} keys but got "
                         f"{q.shape[0]} / {k.shape[0]} tokens")


def merge_partial(
    out_acc: torch.Tensor, lse_acc: torch.Tensor, out_new: torch.Tensor, lse_new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerically stable log-sum-exp merge of two partial attention results.

    Args:
        out_acc: ``[N, H, D]`` accumulator (float32/float64).
        lse_acc: ``[N, H]`` log-sum-exp of the accumulator (``-inf`` where empty).
        out_new: ``[N, H, D]`` partial output of other keys for the same queries.
        lse_new: ``[N, H]`` its log-sum-exp.

    Returns:
        ``(out, lse)`` in the accumulator's dtype: ``lse = log(e^lse_acc + e^lse_new)`` and ``out`` the
        correspondingly weighted mean. Rows where both are ``-inf`` stay 0 / ``-inf``.
    """
    lse_new = lse_new.to(lse_acc.dtype)
    lse = torch.logaddexp(lse_acc, lse_new)  # [N, H]
    safe = torch.where(torch.isinf(lse) & (lse < 0), torch.zeros_like(lse), lse)
    w_acc = torch.exp(lse_acc - safe).unsqueeze(-1)  # [N, H, 1]
    w_new = torch.exp(lse_new - safe).unsqueeze(-1)  # [N, H, 1]
    out = out_acc * w_acc + out_new.to(out_acc.dtype) * w_new
    return out, lse


class RowsWritten:
    """The query rows of a ``fresh`` in-place forward that already hold a result (sorted disjoint ranges).

    :func:`store_rows` writes a partial result to rows not yet written and merges it into the others, so
    segments (and the calls of one segment) may share query rows in any order.
    """

    def __init__(self) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []

    def pieces(self, a: int, b: int) -> list[tuple[int, int, bool]]:
        """``[a, b)`` cut into maximal ``(lo, hi, written)`` pieces, in order."""
        if not self._hi or a >= self._hi[-1]:  # the common case: rows after every written one
            return [(a, b, False)]
        out: list[tuple[int, int, bool]] = []
        i = bisect.bisect_right(self._hi, a)  # first range ending after a
        pos = a
        while pos < b:
            if i < len(self._lo) and self._lo[i] <= pos:
                end = min(b, self._hi[i])
                out.append((pos, end, True))
                i += 1
            else:
                end = b if i >= len(self._lo) else min(b, self._lo[i])
                out.append((pos, end, False))
            pos = end
        return out

    def add(self, a: int, b: int) -> None:
        """Mark ``[a, b)`` written (ranges that overlap or touch it are joined)."""
        i = bisect.bisect_left(self._hi, a)  # first range ending at or after a
        j = bisect.bisect_right(self._lo, b)  # ranges starting at or before b end before index j
        if i < j:
            a, b = min(a, self._lo[i]), max(b, self._hi[j - 1])
        self._lo[i:j] = [a]
        self._hi[i:j] = [b]


def store_rows(out: torch.Tensor, lse: torch.Tensor, a: int, b: int, o: torch.Tensor, l: torch.Tensor, *,
               written: RowsWritten | None) -> None:
    """Put a partial result of query rows ``[a, b)`` into the accumulators (in place).

    Args:
        out ``[N, H, D]``, lse ``[N, H]``: accumulators; o ``[b - a, H, D]``, l ``[b - a, H]``: the partial result.
        written: rows already holding a result (a ``fresh`` call; updated), ``None``: merge into every row.
    """
    if written is None:
        out[a:b], lse[a:b] = merge_partial(out[a:b], lse[a:b], o, l)
        return
    for lo, hi, done in written.pieces(a, b):
        if done:
            out[lo:hi], lse[lo:hi] = merge_partial(out[lo:hi], lse[lo:hi], o[lo - a:hi - a], l[lo - a:hi - a])
        else:
            out[lo:hi], lse[lo:hi] = o[lo - a:hi - a], l[lo - a:hi - a]
    written.add(a, b)
