"""A linear-programming lower bound of the one-layer step time: where a long document's holders run out of tokens.

:func:`.bound.transfer_bound` assumes a part holding a row deep in a long document also holds ``cap`` rows of
it, so that it receives ``cap`` keys fewer. Where a token costs far more than a received key (between nodes a
token's projections and MLP cost ~18,000 pairs, a received key ~1,200), no placement does that: the parts deep in
the document are full of pairs and exposed transfer long before they are full of tokens, and the other documents'
tokens must then go to the remaining parts, which the token cap fills first. :func:`relaxed_bound` counts that
trade-off. For one long document ``d`` (rows ``0 .. L - 1`` cut in ``B`` blocks at ``beta_0 = 0 < ... < beta_B =
L``) and a target time ``tau``, it asks a linear program whether the parts could be arranged within ``tau``:

* A part holding rows of ``d`` has a *class* ``j``: the block of its top row. Per class, continuous aggregates:
  ``n_j`` parts, ``X_jb`` rows of block ``b <= j`` they hold, ``S_j`` tokens of other documents, ``E_j`` exposed
  transfer. Free parts (no row of ``d``): ``n_f`` parts holding ``S_f`` tokens.
* Every row of ``d`` is held once: ``sum_{j >= b} X_jb = |block b|``; a class holds its top rows: ``X_jj >=
  n_j``; every other token is held once: ``sum_j S_j + S_f >= T - L``; ``n_f + sum_j n_j <= P``.
* A part's time is at least ``token_cost * tokens + pairs + max(0, kv * recv - local)``
  (:meth:`.cost.CostModel.time_of`; ``overlap < 1`` and ``diag_block`` only add). A class-``j`` part receives
  at least ``beta_j + 1 - own`` keys of ``d``, its local pairs are at most ``tokens (cap + 1) / 2`` (the chord of
  ``tokens (tokens + 1) / 2`` over ``[0, cap]``), and a row of block ``b`` has at least ``beta_b + 1`` pairs.
  Summed over the class: ``E_j >= kv ((beta_j + 1) n_j - own_j) - (cap + 1) / 2 (own_j + S_j)``, ``E_j >= 0``,
  ``token_cost (own_j + S_j) + sum_b (beta_b + 1) X_jb + E_j <= tau n_j``, ``own_j + S_j <= cap n_j``; free
  parts: ``token_cost S_f <= tau n_f``, ``S_f <= cap n_f``.
* All parts together: ``token_cost T + sum_d pairs + sum_j E_j + sum_{d' != d} e_d'(tau) <= P tau``, where
  ``e_d'`` is the exposure :func:`.bound.document_exposure` proves for every other document longer than the cap
  (a part's exposure is at least the sum of each document's ``max(0, kv recv_d - h)`` for any ``h`` at least its
  local pairs).

Every constraint is a sum of what each part of a placement within ``tau`` and the cap satisfies, so a placement
whose slowest part takes ``tau`` is a feasible point: the smallest feasible ``tau`` (a bisection; every
constraint relaxes as ``tau`` grows) is a lower bound. Only one document is structured at a time (the parts
holding two long documents would need classes of block pairs); the bound is the largest over the ``docs``
longest documents longer than the cap. A hypothesis test checks it against every placement the planner builds
and the oracle's (``tests/unit/test_relaxation.py``).

The linear programs run on scipy's HiGHS (``scipy.optimize.linprog``: a maintained LP solver; nothing here is a
solver). This is an offline measure for the placement sweep and the tests, never part of planning: scipy is a
``test`` / ``bench`` extra and is imported on first use.
"""
from __future__ import annotations

import numpy as np

from hf_hsap.plan.cost import CostModel
from hf_hsap.plan.layout import Layout

from .bound import document_exposure, largest_infeasible, transfer_bound

RELAXED_BLOCKS = 32  # blocks per structured document: on the sweep 16 proves 75 network rows out of reach, 32 78 (29 s)
RELAXED_DOCS = 2  # the longest documents structured, one at a time
RELAXED_TOLERANCE = 1e-3  # the bisection stops when the bound is known to this share


def relaxed_bound(layout: Layout, n_parts: int, cost: CostModel, token_cap: float, *, blocks: int = RELAXED_BLOCKS,
                  docs: int = RELAXED_DOCS, hint: float | None = None) -> float:
    """The smallest time (one full-attention layer, pairs) that the slowest part of any placement of ``layout``
    over ``n_parts`` parts of at most ``token_cap`` tokens can have by ``cost``: the larger of
    :func:`.bound.transfer_bound` and the linear relaxation of the module docstring.

    Args:
        layout: the documents. n_parts: parts. cost: the cost model (the plan's, all-to-all share included).
        token_cap: the most tokens a part may hold (``>= T / n_parts``).
        blocks: blocks per structured document. docs: how many of the longest documents to structure.
        hint: a time known to be reachable (a placement's), where the bisection starts; None: found by doubling.

    Returns:
        The bound, at least :func:`.bound.transfer_bound` (within :data:`RELAXED_TOLERANCE`).
    """
    base = transfer_bound(layout, n_parts, cost, token_cap)
    cap = int(token_cap)
    lengths = np.asarray(layout.doc_lengths, dtype=np.int64)  # [docs]
    best = base
    for d in np.argsort(-lengths, kind="stable")[:docs]:
        if lengths[d] <= cap:
            break
        best = max(best, _smallest_feasible(lengths, int(d), n_parts, cost, cap, best, blocks, hint))
    return best


def _smallest_feasible(lengths: np.ndarray, d: int, n_parts: int, cost: CostModel, cap: int, lo: float,
                       blocks: int, hint: float | None) -> float:
    """The smallest ``tau >= lo`` at which the program of document ``d`` is feasible (to
    :data:`RELAXED_TOLERANCE`), or ``lo`` when it is feasible there."""
    def feasible(tau: float) -> bool:
        return _program(lengths, d, n_parts, cost, cap, tau, blocks)

    if feasible(lo):
        return lo
    return largest_infeasible(feasible, lo, hint if hint is not None and hint > lo else 2.0 * lo, RELAXED_TOLERANCE)


def _program(lengths: np.ndarray, d: int, n_parts: int, cost: CostModel, cap: int, tau: float, blocks: int) -> bool:
    """Whether the linear program of document ``d`` at target ``tau`` (module docstring) has a solution: False only
    where the solver proves it has none (any other answer, e.g. numerical trouble, counts as feasible, so that the
    bound never rises on a solver's doubt).

    Shapes:
        Variables, in order: ``X`` ``[B (B + 1) / 2]`` (class ``j``'s rows of block ``b <= j``, row-major by
        ``j``), ``n``, ``S``, ``E`` ``[B]`` each, then ``n_f``, ``S_f``.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    tc, kv, h = cost.token_cost, cost.kv_token_cost, (cap + 1) / 2.0
    L = int(lengths[d])
    T = int(lengths.sum())
    pairs = float((lengths * (lengths + 1) // 2).sum())
    exposed_elsewhere = 0.0
    for i, other in enumerate(lengths.tolist()):
        if i != d and other > cap:
            e = document_exposure(int(other), tau, cost, cap)
            if e is None:
                return False
            exposed_elsewhere += e
    B = min(blocks, L)
    beta = np.linspace(0, L, B + 1).round().astype(np.int64)  # [B + 1] block starts, then L
    jj, bb = np.tril_indices(B)  # [B (B + 1) / 2] class and block of every X
    nx = jj.shape[0]
    n0, s0, e0 = nx, nx + B, nx + 2 * B
    nf, sf = nx + 3 * B, nx + 3 * B + 1
    classes = np.arange(B)
    ub = _Rows()
    # a class holds its top rows: n_j - X_jj <= 0
    diag = np.flatnonzero(jj == bb)
    ub.add(np.tile(classes, 2), np.concatenate([n0 + classes, diag]), np.repeat([1.0, -1.0], B), np.zeros(B))
    # exposure: kv (beta_j + 1) n_j - (kv + h) own_j - h S_j - E_j <= 0
    ub.add(np.concatenate([jj, classes, classes, classes]), np.concatenate([np.arange(nx), n0 + classes, s0 + classes,
                                                                            e0 + classes]),
           np.concatenate([np.full(nx, -(kv + h)), kv * (beta[:-1] + 1.0), np.full(B, -h), np.full(B, -1.0)]),
           np.zeros(B))
    # time: tc own_j + sum_b (beta_b + 1) X_jb + tc S_j + E_j - tau n_j <= 0
    ub.add(np.concatenate([jj, classes, classes, classes]), np.concatenate([np.arange(nx), s0 + classes, e0 + classes,
                                                                            n0 + classes]),
           np.concatenate([tc + beta[bb] + 1.0, np.full(B, tc), np.ones(B), np.full(B, -tau)]), np.zeros(B))
    # tokens: own_j + S_j - cap n_j <= 0
    ub.add(np.concatenate([jj, classes, classes]), np.concatenate([np.arange(nx), s0 + classes, n0 + classes]),
           np.concatenate([np.ones(nx), np.ones(B), np.full(B, -float(cap))]), np.zeros(B))
    # free parts: tc S_f - tau n_f <= 0, S_f - cap n_f <= 0; parts: n_f + sum_j n_j <= P
    ub.add(np.array([0, 0, 1, 1]), np.array([sf, nf, sf, nf]), [tc, -tau, 1.0, -float(cap)], np.zeros(2))
    ub.add(np.zeros(B + 1, dtype=np.int64), np.append(n0 + classes, nf), np.ones(B + 1), [float(n_parts)])
    # every other token held: -(sum_j S_j + S_f) <= -(T - L)
    ub.add(np.zeros(B + 1, dtype=np.int64), np.append(s0 + classes, sf), np.full(B + 1, -1.0), [-float(T - L)])
    # all parts: sum_j E_j <= P tau - tc T - pairs - exposure of the other documents
    ub.add(np.zeros(B, dtype=np.int64), e0 + classes, np.ones(B),
           [n_parts * tau - tc * T - pairs - exposed_elsewhere])
    # every row of d held once: sum_{j >= b} X_jb = |block b|
    n_vars = nx + 3 * B + 2
    a_eq = coo_matrix((np.ones(nx), (bb, np.arange(nx))), shape=(B, n_vars))
    # tokens and rows in caps, exposures in targets, then every row by its largest coefficient: the same feasible
    # set, with coefficients near 1 (in pairs and tokens they span 1 to 1e9, and HiGHS then often ends "unknown")
    unit = np.ones(n_vars)  # [n_vars]
    unit[:nx], unit[s0:e0], unit[e0:nf], unit[sf] = cap, cap, tau, cap
    a_ub, b_ub = _equilibrated(ub.matrix(n_vars), ub.rhs(), unit)
    a_eq, b_eq = _equilibrated(a_eq, np.diff(beta).astype(np.float64), unit)
    for method in ("highs", "highs-ipm"):  # simplex; where it cannot tell (about 7 % of the sweep's programs), IPM
        res = linprog(np.zeros(n_vars), A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method=method)
        if res.status in (0, 2):  # scipy: 0 = solved (feasible), 2 = infeasible
            return res.status == 0
    return True


def _equilibrated(a, b: np.ndarray, unit: np.ndarray):
    """``a x <= b`` (or ``=``) in the variables ``x / unit``, every row divided by its largest coefficient.

    Shapes:
        ``a`` ``[rows, n_vars]`` sparse, ``b`` ``[rows]``, ``unit`` ``[n_vars]``.
    """
    from scipy.sparse import diags

    scaled = a.tocsr() @ diags(unit)
    top = abs(scaled).max(axis=1).toarray().ravel()  # [rows]
    top[top == 0] = 1.0
    return diags(1.0 / top) @ scaled, b / top


class _Rows:
    """Inequality rows ``A x <= b`` collected block by block (coordinates, values, right-hand sides)."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.b: list[np.ndarray] = []
        self.n = 0

    def add(self, rows, cols, vals, rhs) -> None:
        """One block of rows: ``[nnz]`` row (numbered from 0 within the block), column and value of every
        coefficient; ``rhs`` ``[rows in the block]``."""
        self.rows.append(np.asarray(rows, dtype=np.int64) + self.n)
        self.cols.append(np.asarray(cols, dtype=np.int64))
        self.vals.append(np.asarray(vals, dtype=np.float64))
        rhs = np.asarray(rhs, dtype=np.float64)
        self.b.append(rhs)
        self.n += rhs.shape[0]

    def matrix(self, n_vars: int):
        from scipy.sparse import coo_matrix

        return coo_matrix((np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols))),
                          shape=(self.n, n_vars))

    def rhs(self) -> np.ndarray:
        return np.concatenate(self.b)
