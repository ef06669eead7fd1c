"""The work of one optimiser step on ``B`` matrices with ``p`` orthonormal rows of length ``n`` (``p <= n``; geoopt
holds the same matrices transposed, ``n × p``): the matrix products each method runs and their FLOPs, counted
analytically at ``2·m·k·n`` per product of an ``m × k`` by a ``k × n`` matrix, for the roofline of
``benchmarks/bench_pogo.py`` (issue 43). Elementwise passes (``O(B p n)``) are left out; so is POGO's drift check
(one Gram every ``check_every = 100`` steps).

Counted from the code: our POGO (:func:`~repro.papers.pogo.pogo_update`) and Landing
(:class:`~repro.papers.pogo.Landing`), checked against ``torch.utils.flop_counter.FlopCounterMode`` in
``tests/papers/test_pogo.py``; the public ``pogo-torch`` 1.0.2 (``pogo/pogo.py``: ``_relative_gradient`` and the
step) and geoopt 0.5.1 (``manifolds/stiefel.py``: ``EuclideanStiefel.proju``/``retr``, ``CanonicalStiefel.proju``/
``retr``, through ``optim/rsgd.py``) read from their installed source. The FLOPs of LAPACK's factorisations are the
textbook counts (Golub & Van Loan, *Matrix Computations*, 4th ed., §5.2 and §3.2): Householder QR of an ``n × p``
matrix ``2np² − 2p³/3`` (``geqrf``), forming its thin ``Q`` as many again (``orgqr``), an LU factorisation of an
``n × n`` matrix ``2n³/3`` and its solve with ``p`` right-hand sides ``2n²p``. FlopCounterMode sees the products of
the two geoopt methods but not QR and the solve; the tests check the products.

Per step, with ``P = 2p²n`` (one ``p × n × p`` or ``p × p × n`` product):

- **POGO** (wide form, ``n >= 2p``): the Grams ``X Xᵀ`` and ``M Mᵀ``, ``X Dᵀ``, and ``(X Xᵀ) D``, ``(X Dᵀ) X``,
  ``(M Mᵀ) M``: ``6P = 12p²n``. On the CPU (``p >= 256``) the Grams are block triangles
  (:func:`~repro.papers.pogo.gram`, 64 rows per block): ``p²n (1 + 64/p)`` each, so ``10.25 p²n`` at ``p = 512``
  and ``10.125 p²n`` at ``p = 1024``.
  Square form (``n < 2p``): ``Xᵀ D`` and ``X (Xᵀ D − Dᵀ X)`` (``2n²p`` each), then the Gram of ``M`` and
  ``(M Mᵀ) M``.
- **pogo-torch**: the same six products as six ``bmm`` (always the wide form, full Grams): ``12p²n``.
- **Landing** (our :class:`~repro.papers.pogo.Landing`, no momentum): ``X Xᵀ``, ``X Gᵀ``,
  ``(X Xᵀ)(½G + λX)``, ``(X Gᵀ) X``: ``4P = 8p²n``.
- **geoopt-QR** (Riemannian SGD on ``EuclideanStiefel``, ``x`` the ``n × p`` point): ``xᵀu`` and ``x·sym(xᵀu)``
  (``2np²`` each), then the QR retraction of ``x − lr·ξ``: ``8np² − 4p³/3`` (``7.33 p²n`` at ``n = 2p``).
- **geoopt-Cayley** (``CanonicalStiefel``): ``(x uᵀ) x`` (two ``n × n`` products, ``4n²p``), the skew ``u xᵀ −
  x uᵀ`` (``4n²p``), ``a·x`` (``2n²p``), and the ``n × n`` solve: ``12n²p + 2n³/3``.

At 512×1024: POGO 3.22 GFLOP with full Grams, 2.75 with triangles; pogo-torch 3.22; Landing 2.15; geoopt-QR 1.97;
geoopt-Cayley 7.16.

**Why POGO's step cannot be cheaper** (same step, same rounding model): the tangent step needs ``X Xᵀ D`` and
``X Dᵀ X``; with ``p × p`` intermediates that is two reductions over ``n`` and two expansions (``X (Xᵀ D − Dᵀ X)``
would form ``n × n`` matrices, ``4pn² >= 8p²n`` for ``n >= 2p``). The correction is evaluated at the new point
``M``, so it needs the Gram of ``M`` and one expansion: Landing evaluates its normal term ``(X Xᵀ − I) X`` at ``X``,
where the Gram is already known, and folds it into an expansion it does anyway; that is its two products fewer.
The Gram of ``X`` cannot be reused for ``M Mᵀ``: ``M Mᵀ = X Xᵀ + lr² R Rᵀ`` exactly (``X Rᵀ + R Xᵀ = 0`` for any
``X`` because ``X Xᵀ`` is symmetric), but ``R Rᵀ`` is a Gram of the same size. Folding the correction into the
update, ``X⁺ = (T + ½lr·T X Dᵀ) X − ½lr·(T X Xᵀ) D`` with ``T = (1 + λ)I − λ M Mᵀ``, saves the expansion
``(M Mᵀ) M`` but needs ``M Mᵀ`` from ``X Xᵀ``, ``X Dᵀ`` and ``D Dᵀ`` through eight ``p × p × p`` products:
``8p²n + 16p³`` against ``10p²n``, cheaper only for ``n > 8p``. What is left is the symmetry of the two Grams
(done) and the association (done): ``10.25 p²n`` at 512×1024, 1.28× Landing's and 1.40× geoopt-QR's FLOPs. POGO
is faster than geoopt-QR there only because LAPACK's QR runs far below the matrix-product rate.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .method import _square_form, gram_block_rows

__all__ = [
    "FLOPS", "WORK", "product_flops", "gram_flops", "pogo_flops", "pogo_torch_flops", "landing_flops",
    "geoopt_qr_flops", "geoopt_cayley_flops", "step_bytes",
]


def product_flops(m: int, k: int, n: int, batch: int = 1) -> int:
    """FLOPs of ``batch`` products of an ``m × k`` by a ``k × n`` matrix: ``2·batch·m·k·n``."""
    return 2 * batch * m * k * n


def gram_flops(p: int, n: int, batch: int = 1, block_rows: int = 0) -> int:
    """FLOPs of :func:`~repro.papers.pogo.gram` on ``batch`` ``p × n`` matrices: ``2p²n`` for one product
    (``block_rows = 0``), else the block triangle's products, block ``i`` against the rows from ``i·r`` on:
    ``p²n (1 + r/p)`` when ``r`` divides ``p``."""
    if block_rows == 0 or block_rows >= p:
        return product_flops(p, n, p, batch)
    return sum(product_flops(min(block_rows, p - a), n, p - a, batch) for a in range(0, p, block_rows))


def pogo_flops(batch: int, p: int, n: int, *, device: torch.device | str = "cpu", gram_rows: int | None = None) -> int:
    """FLOPs of one fused POGO step (:func:`~repro.papers.pogo.pogo_update`, scalar ``λ``) on ``batch`` row
    matrices ``p × n``, on ``device`` (which decides the Grams' blocks, as ``gram_rows`` does; see
    :func:`~repro.papers.pogo.gram_block_rows`). The cache blocking over the batch does not change the count."""
    rows = gram_block_rows(p, device, gram_rows)
    correction = gram_flops(p, n, batch, rows) + product_flops(p, p, n, batch)  # M Mᵀ, (M Mᵀ) M
    if _square_form(p, n):
        return 2 * product_flops(n, p, n, batch) + correction  # Xᵀ D (n × n), X (Xᵀ D − Dᵀ X)
    return gram_flops(p, n, batch, rows) + 3 * product_flops(p, p, n, batch) + correction  # X Xᵀ; X Dᵀ, two expansions


def pogo_torch_flops(batch: int, p: int, n: int) -> int:
    """The public ``pogo-torch`` step (SGD base): six ``bmm``, the four of its relative gradient and the two of the
    correction, always ``p × p`` intermediates and full Grams: ``12p²n`` per matrix."""
    return 6 * product_flops(p, n, p, batch)


def landing_flops(batch: int, p: int, n: int) -> int:
    """Our Landing step without momentum: ``X Xᵀ``, ``X Gᵀ``, ``(X Xᵀ)(½G + λX)``, ``(X Gᵀ) X``: ``8p²n``."""
    return 4 * product_flops(p, n, p, batch)


def geoopt_qr_flops(batch: int, p: int, n: int) -> float:
    """geoopt's Riemannian SGD with ``EuclideanStiefel`` on ``n × p`` points: ``proju`` (``xᵀu`` and
    ``x·sym(xᵀu)``, ``2np²`` each) and the QR retraction (``geqrf`` and ``orgqr``, ``2np² − 2p³/3`` each)."""
    return batch * (2 * product_flops(p, n, p) + 2 * (2 * n * p * p - 2 * p**3 / 3))


def geoopt_cayley_flops(batch: int, p: int, n: int) -> float:
    """geoopt's Riemannian SGD with ``CanonicalStiefel``: ``proju`` ``u − (x uᵀ) x`` (``n × n`` intermediate,
    ``4n²p``), the retraction's skew ``u xᵀ − x uᵀ`` (``4n²p``) and ``a·x`` (``2n²p``), and the solve of
    ``(I − ½a) y = x + ½a·x`` (LU ``2n³/3`` and ``2n²p``)."""
    return batch * (5 * product_flops(n, p, n) + 2 * n**3 / 3 + 2 * n * n * p)


def step_bytes(batch: int, p: int, n: int, element_size: int = 4) -> int:
    """A lower bound on any method's memory traffic per step: read the point and the gradient, write the point."""
    return 3 * batch * p * n * element_size


FLOPS: dict[str, Callable[..., float]] = {
    "POGO": pogo_flops, "pogo-torch": pogo_torch_flops, "Landing": landing_flops, "geoopt-QR": geoopt_qr_flops,
    "geoopt-Cayley": geoopt_cayley_flops,
}
"""Each method's FLOPs per step, ``f(batch, p, n)`` (``pogo_flops`` also takes ``device`` and ``gram_rows``)."""

WORK = {
    "POGO": "X Xᵀ, M Mᵀ (block triangles on the CPU for p >= 256), X Dᵀ; (X Xᵀ) D, (X Dᵀ) X, (M Mᵀ) M "
            "[square form n < 2p: Xᵀ D, X (Xᵀ D − Dᵀ X), M Mᵀ, (M Mᵀ) M]",
    "pogo-torch": "X Xᵀ, X Gᵀ, M Mᵀ; (X Xᵀ) G, (X Gᵀ) X, (M Mᵀ) M (six bmm, full Grams)",
    "Landing": "X Xᵀ, X Gᵀ; (X Xᵀ)(½G + λX), (X Gᵀ) X",
    "geoopt-QR": "xᵀu, x·sym(xᵀu); QR (geqrf + orgqr) of the n × p step",
    "geoopt-Cayley": "x uᵀ (n × n), (x uᵀ) x, u xᵀ − x uᵀ (n × n), a·x; LU solve of an n × n system",
}
"""The products each method runs per step (``x``: geoopt's ``n × p`` form)."""
