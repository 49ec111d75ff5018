"""Rules for FFTs and matrix routines (factorizations, eigendecompositions, solves): one
transform or factorization reads its core dims whole; the leading batch dims split. See
`opspace` for what a rule describes. Pure.
"""

from __future__ import annotations

import math

from ..program.graph import Equation, Program
from .opspace import (
    DimMap,
    OpSpace,
    dim_names,
    out_shape,
    register_rule,
    replicated_space,
    shape_of,
)

# Trailing dims of the first operand that one transform or factorization reads whole (the rest
# are batch dims): an FFT's ``fft_lengths``, a pivot vector's or a tridiagonal band's one, a
# matrix's two
_CORE_DIMS = {"lu_pivots_to_permutation": 1, "tridiagonal_solve": 1}


def _core_flops(eqn: Equation, program: Program) -> float:
    """Floating-point operations of one transform or factorization of the core dims, for an
    m x n matrix (k = min(m, n), M = max(m, n)) or n points; counts from Golub & Van Loan,
    "Matrix Computations", 4th ed. (Householder and Golub-Kahan algorithms):

    - FFT: 5 N log2 N (Cooley-Tukey), N = prod(fft_lengths);
    - Cholesky: n^3 / 3; triangular solve: n^2 per right-hand side;
    - LU: 2mnk - (m + n) k^2 + 2k^3 / 3 (2n^3 / 3 square); its pivots to a permutation:
      one swap per pivot;
    - QR (Householder): 2Mk^2 - 2k^3 / 3 for R (``geqrf``) or for forming Q
      (``householder_product``); both (``qr``): 4Mk^2 - 4k^3 / 3;
    - symmetric eigendecomposition: 9 n^3; general (``eig``): 10 n^3 for the eigenvalues,
      25 n^3 with eigenvectors; a symmetric matrix to tridiagonal form (``tridiagonal``,
      Householder): 4 n^3 / 3;
    - ``symmetric_product`` (alpha a a^T + beta c, a: n x k): 2 n^2 k + 3 n^2, the product
      and the scaled sum JAX lowers it to;
    - SVD: 4Mk^2 - 4k^3 / 3 for the singular values (bidiagonalization),
      4M^2 k + 8Mk^2 + 9k^3 with U and V (R-SVD);
    - tridiagonal solve: 8 m per right-hand side (Thomas' algorithm).
    """
    prim, p = eqn.primitive, eqn.params
    src = shape_of(program, eqn.inputs[0])
    if prim == "fft":
        n = math.prod(p["fft_lengths"])
        return 5.0 * n * max(1.0, math.log2(n))
    if prim == "lu_pivots_to_permutation":
        return float(src[-1])
    if prim == "tridiagonal_solve":  # dl, d, du [.., m], b [.., m, n]
        return 8.0 * math.prod(shape_of(program, eqn.inputs[3])[-2:])
    m, n = src[-2:]
    k, big = min(m, n), max(m, n)
    householder = 2.0 * big * k**2 - 2.0 * k**3 / 3.0
    if prim == "triangular_solve":  # a [.., n, n], b [.., n, k] or [.., k, n]
        return float(n * math.prod(shape_of(program, eqn.inputs[1])[-2:]))
    if prim == "cholesky":
        return n**3 / 3.0
    if prim == "eigh":
        return 9.0 * n**3
    if prim == "tridiagonal":
        return 4.0 * n**3 / 3.0
    if prim == "symmetric_product":  # a [.., n, k]
        return 2.0 * m**2 * n + 3.0 * m**2
    if prim == "lu":
        return 2.0 * m * n * k - (m + n) * k**2 + 2.0 * k**3 / 3.0
    if prim in ("geqrf", "householder_product"):
        return householder
    if prim == "qr":
        return 2.0 * householder
    if prim == "eig":
        vectors = p["compute_left_eigenvectors"] or p["compute_right_eigenvectors"]
        return (25.0 if vectors else 10.0) * n**3
    if prim == "svd":
        if not p["compute_uv"]:
            return 2.0 * householder
        return 4.0 * big**2 * k + 8.0 * big * k**2 + 9.0 * k**3
    raise KeyError(prim)


@register_rule(
    "fft", "cholesky", "triangular_solve", "eigh", "eig", "lu", "lu_pivots_to_permutation",
    "qr", "geqrf", "householder_product", "svd", "tridiagonal_solve", "tridiagonal",
    "symmetric_product",
)  # fmt: skip
def batched_core_rule(eqn: Equation, program: Program) -> OpSpace:
    """FFTs over their trailing ``fft_lengths`` dims, a matrix's factorizations (Cholesky, LU,
    QR, SVD, eigendecompositions) and solves over its trailing two, a pivot vector's or a
    tridiagonal system's band over its last: those core dims stay whole (one transform is
    never split), as are a symmetric product's (alpha a a^T + beta c) and a reduction to
    tridiagonal form's; the leading batch dims, the same in every operand and result (a Shampoo
    preconditioner per layer, an FFT per channel), split like a batch. Operands or results
    that do not share the batch run replicated. ``flops = |batch| · core flops``
    (`_core_flops`)."""
    p = eqn.params
    core = len(p["fft_lengths"]) if eqn.primitive == "fft" else _CORE_DIMS.get(eqn.primitive, 2)
    src = shape_of(program, eqn.inputs[0])
    batch = src[: len(src) - core]
    shapes = [shape_of(program, t) for t in (*eqn.inputs, *eqn.outputs) if t is not None]
    if any(shape[: len(batch)] != batch for shape in shapes):
        return replicated_space(eqn, program)
    nb = len(batch)

    def batch_map(shape: tuple[int, ...]) -> DimMap:
        return tuple(range(nb)) + (None,) * (len(shape) - nb)

    return OpSpace(
        batch, (True,) * nb, dim_names(nb),
        tuple(None if t is None else batch_map(shape_of(program, t)) for t in eqn.inputs),
        tuple(batch_map(out_shape(eqn, program, i)) for i in range(len(eqn.outputs))),
        float(math.prod(batch)) * _core_flops(eqn, program),
    )  # fmt: skip
