"""Solvers for the two resolvent systems of policy evaluation.

For a team kernel K = P_pi (S x S, row-stochastic) and gamma in (0, 1):

    values     (I - gamma K)   x = b      (Bellman equation, V = (I - gamma P_pi)^{-1} r_pi)
    occupancy  (I - gamma K^T) y = c      (THEORY.md §1, d = (1-gamma)(I - gamma P_pi^T)^{-1} rho0)

The solver is chosen by structure and size:

* small S: one sparse LU factorisation serves both systems (``trans='T'`` for the second);
* K triangular, or a DAG (tree, chain) after a topological reordering: two sparse triangular
  solves, no fill-in whatever S is;
* otherwise an iterative solver (Richardson, GMRES when Richardson contracts slowly),
  preconditioned by a rank-one deflation. A sparse LU of a
  large random MDP fills in catastrophically, so it is never attempted there.

The deflation (Brauer's theorem): K 1 = 1, so for any v with v^T 1 = 1 the matrix K - 1 v^T has
the eigenvalues of K with the eigenvalue 1 replaced by 0. The preconditioner
M = I + gamma/(1-gamma) 1 mu^T makes the preconditioned iteration matrix gamma (K - 1 v^T), so
the iteration converges at the rate gamma |lambda_2(K)| instead of gamma: the slow mode
(the one value iteration crawls along) is removed exactly. The adjoint system uses the same
construction with the roles of the left and right eigenvectors swapped.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from numpy.typing import NDArray
from scipy.sparse.csgraph import reverse_cuthill_mckee

DIRECT_MAX_STATES = 300
"""Up to this many states a sparse LU is cheap whatever the structure. Beyond, a random MDP fills
its factors in and the Krylov path is far cheaper (docs/tabular_results.md, "The exact solver")."""
DAG_MAX_LEVELS = 4096
"""Topological peeling gives up after this many levels (a long chain stored out of order)."""
SLOW_MIXING_DIRECT_MAX_STATES = 50_000
"""Up to this size a slowly mixing MDP is handed from Richardson to a sparse LU..."""
SLOW_MIXING_DIRECT_MAX_FILL = 10_000_000
"""... provided its LU stays sparse: S times the bandwidth after a reverse Cuthill-McKee
ordering (a bound on the fill of a banded LU) is at most this. Rings and grids pass; a random
MDP (bandwidth ~ S) never does, whatever Richardson observes, so it is never factorised."""
GMRES_RESTART = 20
GMRES_MAX_MATVECS = 20000
RICHARDSON_MAX_MATVECS = 2000
RICHARDSON_RATE_WINDOW = 5
RICHARDSON_SLOW_RATE = 0.7
"""Above this observed contraction per product, GMRES takes over from Richardson."""

Vector = NDArray[np.float64]

METHODS = ("auto", "direct-lu", "direct-triangular", "direct-dag", "krylov-gmres")
"""The ``method`` names ``solve_resolvent_pair`` (and ``sim.evaluate``) accept."""


class SolverError(RuntimeError):
    """The iterative solver did not reach the requested residual."""


class _SlowMixing(Exception):
    """Richardson contracts slowly: a direct solve is preferable when it is affordable."""


@dataclass(frozen=True)
class ResolventSolution:
    """Solutions of the value and occupancy systems and how they were obtained."""

    values: Vector
    """x with (I - gamma K) x = b."""
    adjoint: Vector
    """y with (I - gamma K^T) y = c."""
    method: str
    """'identity' (gamma = 0), 'direct-lu', 'direct-triangular', 'direct-dag' or 'krylov-gmres'."""
    residual: float
    """max of the two relative residuals ||rhs - M x||_2 / ||rhs||_2."""
    matvecs: int = 0
    """Matrix-vector products used by the Krylov solver (0 for direct solves)."""


def validate_solver_options(rtol: float, method: str) -> None:
    """Raise ValueError unless 0 < rtol < 1 (a real number) and ``method`` is one of METHODS.

    rtol <= 0 can never be met (the iteration would run to its cap of tens of thousands of
    products before failing), NaN would compare false and stop at once with an unsolved
    system, and rtol >= 1 is met by x = 0. Positive values below float64's resolution
    (~1e-16) are refused quickly by the solver itself, with the residual it reached.
    """
    if isinstance(rtol, bool) or not isinstance(rtol, numbers.Real) or not 0.0 < rtol < 1.0:
        raise ValueError(f"rtol must be a real number in (0, 1), got {rtol!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")


def relative_residual(operator: Callable[[Vector], Vector], solution: Vector, rhs: Vector) -> float:
    """||rhs - operator(solution)||_2 / ||rhs||_2, computed after scaling by max |rhs|.

    The scaling keeps the norm from underflowing when rhs is tiny (e.g. rewards of 1e-200).
    """
    scale = float(np.abs(rhs).max(initial=0.0))
    if scale == 0.0:
        return float(np.abs(solution).max(initial=0.0))
    unit_rhs = rhs / scale
    return float(np.linalg.norm(unit_rhs - operator(solution / scale)) / np.linalg.norm(unit_rhs))


def _safe_norm(vector: Vector) -> float:
    """||vector||_2 without underflow for tiny entries (scale by the largest first)."""
    largest = float(np.abs(vector).max(initial=0.0))
    if largest == 0.0:
        return 0.0
    return largest * float(np.linalg.norm(vector / largest))


def _offdiagonal_pattern(kernel: sp.csr_matrix) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Row and column of every positive off-diagonal entry (the transition graph's edges)."""
    rows = np.repeat(np.arange(kernel.shape[0]), np.diff(kernel.indptr))
    cols = kernel.indices
    edge = (kernel.data != 0) & (rows != cols)
    return rows[edge], cols[edge].astype(np.int64)


def topological_order(
    kernel: sp.csr_matrix, max_levels: int = DAG_MAX_LEVELS
) -> NDArray[np.int64] | None:
    """An order in which every transition (other than a self-loop) goes forward, or None.

    Kahn's algorithm, one vectorised step per level; None if the graph has a cycle or more
    than ``max_levels`` levels.
    """
    n = kernel.shape[0]
    rows, cols = _offdiagonal_pattern(kernel)
    graph = sp.csr_matrix((np.ones(rows.size, dtype=np.int8), (rows, cols)), shape=(n, n))
    in_degree = np.bincount(graph.indices, minlength=n).astype(np.int64)
    frontier = np.flatnonzero(in_degree == 0)
    levels: list[NDArray[np.int64]] = []
    placed = 0
    while frontier.size:
        if len(levels) >= max_levels:
            return None
        levels.append(frontier)
        placed += frontier.size
        starts = graph.indptr[frontier]
        lengths = graph.indptr[frontier + 1] - starts
        total = int(lengths.sum())
        if total == 0:
            break
        # Gather the out-edges of all frontier nodes at once.
        offsets = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(total)
        targets, counts = np.unique(graph.indices[offsets], return_counts=True)
        in_degree[targets] -= counts
        frontier = targets[in_degree[targets] == 0]
    if placed != n:
        return None
    return np.concatenate(levels)


def _row_index_range(kernel: sp.csr_matrix) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Smallest and largest column index stored in each row (every row is non-empty)."""
    starts = kernel.indptr[:-1]
    return (
        np.minimum.reduceat(kernel.indices, starts).astype(np.int64),
        np.maximum.reduceat(kernel.indices, starts).astype(np.int64),
    )


def _triangular_side(
    kernel: sp.csr_matrix, index_range: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None
) -> str | None:
    """'upper' or 'lower' when every stored transition goes forward (backward) in index order."""
    lowest, highest = _row_index_range(kernel) if index_range is None else index_range
    rows = np.arange(kernel.shape[0])
    if np.all(lowest >= rows):
        return "upper"
    if np.all(highest <= rows):
        return "lower"
    return None


def _resolvent_matrix(kernel: sp.csr_matrix, gamma: float) -> sp.csr_matrix:
    n = kernel.shape[0]
    matrix = sp.identity(n, format="csr") - gamma * kernel
    matrix.sum_duplicates()
    matrix.eliminate_zeros()
    return sp.csr_matrix(matrix)


def _solve_triangular(
    kernel: sp.csr_matrix, gamma: float, b: Vector, c: Vector, upper: bool
) -> tuple[Vector, Vector]:
    matrix = _resolvent_matrix(kernel, gamma)
    x = spla.spsolve_triangular(matrix, b, lower=not upper)
    y = spla.spsolve_triangular(sp.csr_matrix(matrix.T), c, lower=upper)
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)


def _gmres(
    operator: Callable[[Vector], Vector],
    preconditioner: Callable[[Vector], Vector],
    rhs: Vector,
    rtol: float,
    restart: int = GMRES_RESTART,
    max_matvecs: int = GMRES_MAX_MATVECS,
) -> tuple[Vector, int, float]:
    """Restarted right-preconditioned GMRES on operator(preconditioner(z)) = rhs.

    Classical Gram-Schmidt with a second pass only when cancellation is detected ("twice is
    enough"), so each step is one matrix-vector product plus two BLAS-2 sweeps. The true
    residual is recomputed at every restart and decides convergence.
    """
    scale = _safe_norm(rhs)
    if scale == 0.0:
        return np.zeros_like(rhs), 0, 0.0
    # Work on the unit-norm right-hand side: the tolerance is then relative whatever the size
    # of rhs (a tiny (1-gamma) rho0 or tiny rewards lose nothing to an absolute threshold).
    b = rhs / scale
    x = np.zeros_like(b)
    residual_vector = b.copy()
    residual = 1.0
    matvecs = 0
    n = b.size
    basis = np.empty((restart + 1, n))
    while residual > rtol and matvecs < max_matvecs:
        hessenberg = np.zeros((restart + 1, restart))
        basis[0] = residual_vector / residual
        target = np.zeros(restart + 1)
        target[0] = residual
        coefficients: NDArray[np.float64] = np.zeros(0)
        steps = 0
        for j in range(restart):
            w = operator(preconditioner(basis[j]))
            matvecs += 1
            norm_before = float(np.linalg.norm(w))
            h = basis[: j + 1] @ w
            w -= h @ basis[: j + 1]
            norm_after = float(np.linalg.norm(w))
            if norm_after < 0.7 * norm_before:
                correction = basis[: j + 1] @ w
                w -= correction @ basis[: j + 1]
                h += correction
                norm_after = float(np.linalg.norm(w))
            hessenberg[: j + 1, j] = h
            hessenberg[j + 1, j] = norm_after
            steps = j + 1
            coefficients = np.linalg.lstsq(
                hessenberg[: j + 2, : j + 1], target[: j + 2], rcond=None
            )[0].astype(np.float64)
            estimate = float(
                np.linalg.norm(target[: j + 2] - hessenberg[: j + 2, : j + 1] @ coefficients)
            )
            if norm_after <= 1e-14 * norm_before or estimate <= 0.3 * rtol:
                break
            basis[j + 1] = w / norm_after
            if matvecs >= max_matvecs:
                break
        x += preconditioner(coefficients @ basis[:steps])
        residual_vector = b - operator(x)
        matvecs += 1
        residual = float(np.linalg.norm(residual_vector))
    return x * scale, matvecs, residual


def _deflated_richardson(
    operator: Callable[[Vector], Vector],
    preconditioner: Callable[[Vector], Vector],
    rhs: Vector,
    rtol: float,
    direct_affordable: bool = False,
) -> tuple[Vector, int, float]:
    """Preconditioned Richardson x <- x + M (b - A x), falling back to GMRES when it is slow.

    With the deflation M the iteration matrix is gamma (K - 1 v^T), spectral radius
    gamma |lambda_2(K)| (module docstring). Random MDPs mix fast, so it is small there and
    Richardson needs as few products as GMRES while costing one product and a few vector
    operations per step (GMRES's orthogonalisation would cost more than the sparse product
    itself). When the observed contraction is poor (slowly mixing chains, grids), GMRES takes
    over from the current iterate.
    """
    scale = _safe_norm(rhs)
    if scale == 0.0:
        return np.zeros_like(rhs), 0, 0.0
    # Unit-norm right-hand side: the tolerance is relative whatever the size of rhs (a tiny
    # (1-gamma) rho0 or tiny rewards lose nothing to an absolute threshold).
    b = rhs / scale
    x = np.zeros_like(b)
    residual_vector = b
    history = [1.0]
    matvecs = 0
    while history[-1] > rtol and matvecs < RICHARDSON_MAX_MATVECS:
        x += preconditioner(residual_vector)
        residual_vector = b - operator(x)
        matvecs += 1
        history.append(float(np.linalg.norm(residual_vector)))
        window = RICHARDSON_RATE_WINDOW
        # The first step can raise the residual (the deflation moves all the mass at once):
        # measure the contraction only from the second iterate on.
        if len(history) > window + 2 and history[-1] > rtol:
            rate = (history[-1] / history[-1 - window]) ** (1.0 / window)
            if rate > RICHARDSON_SLOW_RATE:
                if direct_affordable:
                    raise _SlowMixing
                correction, used, _ = _gmres(
                    operator, preconditioner, residual_vector, rtol / history[-1]
                )
                x += correction
                matvecs += used
                residual_vector = b - operator(x)
                history.append(float(np.linalg.norm(residual_vector)))
                break
    return x * scale, matvecs, history[-1]


def _solve_krylov(
    kernel: sp.csr_matrix,
    gamma: float,
    b: Vector,
    c: Vector,
    rtol: float,
    direct_affordable: bool = False,
) -> tuple[Vector, Vector, int, float]:
    n = kernel.shape[0]
    transpose = kernel.T  # CSC view of the same arrays: no copy
    deflation = gamma / (1.0 - gamma) / n

    def values_operator(v: Vector) -> Vector:
        return v - gamma * (kernel @ v)

    def adjoint_operator(v: Vector) -> Vector:
        return v - gamma * (transpose @ v)

    def preconditioner(v: Vector) -> Vector:
        # Values: M = I + gamma/(1-gamma) 1 mu^T with mu uniform. Adjoint: M = I +
        # gamma/(1-gamma) w 1^T with w uniform (1 is the left eigenvector of K^T). Both are
        # v + gamma/(1-gamma) * mean(v).
        return v + deflation * v.sum()

    # numpy's floating-point error state is per thread: the workers take the caller's (so
    # sim.evaluate's overflow handling holds inside them too).
    caller_errors = np.geterr()

    def solve(operator: Callable[[Vector], Vector], rhs: Vector) -> tuple[Vector, int, float]:
        with np.errstate(**caller_errors):
            return _deflated_richardson(operator, preconditioner, rhs, rtol, direct_affordable)

    # The two systems are independent and the sparse products release the GIL: solve them
    # side by side on two threads.
    with ThreadPoolExecutor(max_workers=2) as pool:
        values_job = pool.submit(solve, values_operator, b)
        adjoint_job = pool.submit(solve, adjoint_operator, c)
        x, used_x, res_x = values_job.result()
        y, used_y, res_y = adjoint_job.result()
    if max(res_x, res_y) > rtol:
        raise SolverError(
            f"the Krylov solver stopped at relative residual {max(res_x, res_y):.2e} > "
            f"{rtol:.0e} after {used_x + used_y} matrix-vector products (S = {n}, gamma = {gamma})"
        )
    return x, y, used_x + used_y, max(res_x, res_y)


def solve_resolvent_pair(
    kernel: sp.csr_matrix,
    gamma: float,
    values_rhs: Vector,
    adjoint_rhs: Vector,
    *,
    rtol: float = 1e-11,
    method: str = "auto",
) -> ResolventSolution:
    """Solve (I - gamma K) x = values_rhs and (I - gamma K^T) y = adjoint_rhs.

    ``method`` is 'auto' (by structure and size, see the module docstring), 'direct-lu' or
    'krylov-gmres'. ``kernel`` may hold duplicate entries (they are summed).
    """
    validate_solver_options(rtol, method)
    n = kernel.shape[0]
    if gamma == 0.0:
        return ResolventSolution(values_rhs.copy(), adjoint_rhs.copy(), "identity", 0.0)

    matvecs = 0
    if method == "auto":
        method = _choose_method(kernel)
        if method == "krylov-gmres" and n <= SLOW_MIXING_DIRECT_MAX_STATES:
            # Slow mixing (|lambda_2| near 1) comes from geometric structure (rings, grids),
            # whose LU factors stay sparse; random MDPs mix fast and never get here.
            try:
                x, y, matvecs, residual = _solve_krylov(
                    kernel, gamma, values_rhs, adjoint_rhs, rtol, direct_affordable=True
                )
                return ResolventSolution(x, y, method, residual, matvecs)
            except _SlowMixing:
                # The choice depends on the kernel's structure only, never on timing.
                if _banded_fill(kernel) <= SLOW_MIXING_DIRECT_MAX_FILL:
                    method = "direct-lu"
    if method == "direct-lu":
        lu = spla.splu(sp.csc_matrix(_resolvent_matrix(kernel, gamma)))
        x = lu.solve(values_rhs)
        y = lu.solve(adjoint_rhs, trans="T")
    elif method == "direct-triangular":
        side = _triangular_side(kernel)
        if side is None:
            raise ValueError("direct-triangular needs a triangular kernel")
        x, y = _solve_triangular(kernel, gamma, values_rhs, adjoint_rhs, upper=side == "upper")
    elif method == "direct-dag":
        order = topological_order(kernel)
        if order is None:
            raise ValueError("direct-dag needs an acyclic transition graph")
        permuted = sp.csr_matrix(kernel[order][:, order])
        x_perm, y_perm = _solve_triangular(
            permuted, gamma, values_rhs[order], adjoint_rhs[order], upper=True
        )
        x = np.empty(n)
        y = np.empty(n)
        x[order] = x_perm
        y[order] = y_perm
    elif method == "krylov-gmres":
        # The iterative solver's stopping test is the true residual: no second check needed.
        x, y, matvecs, residual = _solve_krylov(kernel, gamma, values_rhs, adjoint_rhs, rtol)
        return ResolventSolution(x, y, method, residual, matvecs)
    else:
        raise ValueError(f"unknown method {method!r}")

    transpose = kernel.T
    residual = max(
        relative_residual(lambda v: v - gamma * (kernel @ v), x, values_rhs),
        relative_residual(lambda v: v - gamma * (transpose @ v), y, adjoint_rhs),
    )
    return ResolventSolution(
        np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64), method, residual, matvecs
    )


def _banded_fill(kernel: sp.csr_matrix) -> int:
    """S times the bandwidth of I - gamma K after a reverse Cuthill-McKee ordering."""
    n = kernel.shape[0]
    rows, cols = _offdiagonal_pattern(kernel)
    if rows.size == 0:
        return n
    pattern = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))
    order = reverse_cuthill_mckee(pattern, symmetric_mode=False)
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    bandwidth = int(np.abs(position[rows] - position[cols]).max())
    return n * bandwidth


def _choose_method(kernel: sp.csr_matrix) -> str:
    if kernel.shape[0] <= DIRECT_MAX_STATES:
        return "direct-lu"
    lowest, highest = _row_index_range(kernel)
    if _triangular_side(kernel, (lowest, highest)) is not None:
        return "direct-triangular"
    # A finite DAG has a sink, a state whose only transition is to itself. This O(S) test
    # rules out random MDPs before the O(nnz) topological peeling.
    rows = np.arange(kernel.shape[0])
    has_sink = bool(np.any((lowest == rows) & (highest == rows)))
    if has_sink and topological_order(kernel) is not None:
        return "direct-dag"
    return "krylov-gmres"
