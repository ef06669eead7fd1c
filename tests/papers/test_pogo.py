"""repro.papers.pogo against independent references: the PyPI ``pogo-torch`` package step for step, the SVD polar factor
(scipy), finite-difference Riemannian gradients, a hand-coded square-matrix Landing (pierreablin/landing's formula),
``numpy.roots`` and a dense grid for the quartic λ."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.linalg import polar

from repro.common.linalg import newton_schulz5
from repro.papers import pogo as P
from repro.papers.pogo.method import _block_size, _polyval

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def quadratic_problem(b: int, p: int, n: int, seed: int = 0):
    """A batch of non-convex quadratics f(X) = Σ_b −½ tr(X A Xᵀ) + ⟨C, X⟩ on row matrices (b, p, n)."""
    g = gen(seed)
    A = torch.randn(b, n, n, generator=g, dtype=F64)
    A = A @ A.mT / n
    C = torch.randn(b, p, n, generator=g, dtype=F64)

    def loss(X: torch.Tensor) -> torch.Tensor:
        return -0.5 * torch.einsum("bpn,bnm,bpm->", X, A, X) + (X * C).sum()

    return loss


def import_reference():
    """The PyPI ``pogo-torch`` package (its import of torch.compile warns about torch.jit); skip if absent."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pogo_ref = pytest.importorskip("pogo")
        from pogo import base
        from pogo.pogo import compute_lambda
    return pogo_ref, base, compute_lambda


def grad_of(loss, X: torch.Tensor) -> torch.Tensor:
    Xg = X.detach().clone().requires_grad_()
    loss(Xg).backward()
    return Xg.grad


# ---------------------------------------------------------------------------------------------------------
# Helpers


def test_random_stiefel_is_orthonormal_seeded_and_oriented():
    X = P.random_stiefel(7, 3, 5, dtype=F64, generator=gen(0))
    assert X.shape == (7, 3, 5)
    torch.testing.assert_close(X @ X.mT, torch.eye(3, dtype=F64).expand(7, 3, 3), atol=1e-13, rtol=0)
    assert torch.equal(X, P.random_stiefel(7, 3, 5, dtype=F64, generator=gen(0)))
    Y = P.random_stiefel((2, 4), 3, 5, rows=False, generator=gen(1))
    assert Y.shape == (2, 4, 5, 3) and Y.dtype == torch.float32
    assert float(P.orthogonality_error(Y).max()) < 1e-5
    with pytest.raises(ValueError, match="p <= n"):
        P.random_stiefel(2, 5, 3)


def test_random_stiefel_is_haar_on_average():
    # E[X] = 0 and E[X_ij²] = 1/n for Haar-distributed orthogonal matrices
    X = P.random_stiefel(20000, 2, 4, dtype=F64, generator=gen(3))
    assert float(X.mean(0).abs().max()) < 0.02
    assert float((X.square().mean(0) - 0.25).abs().max()) < 0.01


def test_orthogonality_error_matches_definition():
    X = torch.randn(4, 3, 6, dtype=F64, generator=gen(2))
    want = torch.stack([torch.linalg.norm(x @ x.T - torch.eye(3, dtype=F64)) for x in X])
    torch.testing.assert_close(P.orthogonality_error(X), want)
    torch.testing.assert_close(P.orthogonality_error(X.mT), want)  # tall: Xᵀ X
    with pytest.raises(ValueError, match="matrix"):
        P.orthogonality_error(torch.ones(3))


# ---------------------------------------------------------------------------------------------------------
# Tangent step


@pytest.mark.parametrize("shape", [(5, 3, 8), (4, 6, 6)])
def test_relative_gradient_is_tangent_and_half_the_canonical_gradient(shape):
    X = P.random_stiefel(shape[0], shape[1], shape[2], dtype=F64, generator=gen(4))
    G = torch.randn(*shape, dtype=F64, generator=gen(5))
    R = P.relative_gradient(X, G)
    torch.testing.assert_close(X @ R.mT + R @ X.mT, torch.zeros(shape[0], shape[1], shape[1], dtype=F64),
                               atol=1e-12, rtol=0)
    # canonical Riemannian gradient of the column form Y = Xᵀ is G_Y − Y G_Yᵀ Y (geoopt's CanonicalStiefel.proju)
    Y, GY = X.mT, G.mT
    torch.testing.assert_close(2 * R, (GY - Y @ GY.mT @ Y).mT, atol=1e-12, rtol=0)


def test_relative_gradient_against_finite_differences_non_square():
    # PCA-type loss on wide matrices (p < n): the canonical metric g(U, V) = tr(U (I − ½ XᵀX) Vᵀ) pairs 2R with
    # any tangent V to give the directional derivative, measured by central differences along a retraction.
    p, n = 3, 9
    X = P.random_stiefel(1, p, n, dtype=F64, generator=gen(6))[0]
    A = torch.randn(n, n, dtype=F64, generator=gen(7))
    A = A + A.T

    def f(Z):
        return -0.5 * torch.trace(Z @ A @ Z.T)

    G = grad_of(f, X)
    R = P.relative_gradient(X, G)
    assert float(R.norm()) > 1e-3  # the trap: skew(G Xᵀ) X is zero here
    naive = 0.5 * (G @ X.T - X @ G.T) @ X
    assert float(naive.norm()) < 1e-12
    for seed in range(5):
        W = torch.randn(p, p, dtype=F64, generator=gen(10 + seed))
        V = (W - W.T) @ X + torch.randn(p, n, dtype=F64, generator=gen(20 + seed)) @ (torch.eye(n, dtype=F64) - X.T @ X)
        h = 1e-5
        def retract(Z):
            U, _, Vt = torch.linalg.svd(Z, full_matrices=False)
            return U @ Vt
        fd = (f(retract(X + h * V)) - f(retract(X - h * V))) / (2 * h)
        metric = torch.trace(2 * R @ (torch.eye(n, dtype=F64) - 0.5 * X.T @ X) @ V.T)
        assert abs(float(fd - metric)) < 1e-6 * max(1.0, abs(float(fd)))


def test_symmetric_directions_leave_the_point_fixed():
    # G = S X with S symmetric has skew(Xᵀ G) = 0: no tangent move, and the normal step keeps X.
    X = P.random_stiefel(6, 4, 7, dtype=F64, generator=gen(8))
    S = torch.randn(6, 4, 4, dtype=F64, generator=gen(9))
    G = (S + S.mT) @ X
    torch.testing.assert_close(P.relative_gradient(X, G), torch.zeros_like(X), atol=1e-12, rtol=0)
    Xp = X.clone().requires_grad_()
    Xp.grad = G.clone()
    P.POGO([Xp], lr=0.3).step()
    torch.testing.assert_close(Xp.detach(), X, atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# Normal step


def perturbed(X: torch.Tensor, delta: float, seed: int) -> torch.Tensor:
    """X moved off the manifold: its singular values scaled by 1 + delta·u, u uniform in [−1, 1]."""
    U, _, Vt = torch.linalg.svd(X, full_matrices=False)
    u = 2 * torch.rand(X.shape[:-2] + (X.shape[-2],), dtype=F64, generator=gen(seed)) - 1
    return U @ torch.diag_embed(1 + delta * u) @ Vt


def test_normal_step_is_newton_schulz_and_contracts_quadratically():
    X = P.random_stiefel(8, 5, 9, dtype=F64, generator=gen(11))
    d0s, d1s = [], []
    for k, delta in enumerate(np.logspace(-4, -0.7, 12)):
        M = perturbed(X, float(delta), 100 + k) + 1e-3 * delta * torch.randn(X.shape, dtype=F64, generator=gen(k))
        out = P.normal_correction(M)
        torch.testing.assert_close(out, 1.5 * M - 0.5 * M @ M.mT @ M)
        d0s.append(float(P.orthogonality_error(M).max()))
        d1s.append(float(P.orthogonality_error(out).max()))
    slope = np.polyfit(np.log(d0s), np.log(d1s), 1)[0]
    assert 1.8 <= slope <= 2.2
    assert all(d1 <= d0**2 for d0, d1 in zip(d0s, d1s, strict=True))  # constant ~3/4 for singular values near 1


def test_normal_step_fixed_point_is_the_polar_factor():
    X = P.random_stiefel(3, 4, 6, dtype=F64, generator=gen(12))
    M = perturbed(X, 0.4, 13) + 0.05 * torch.randn(X.shape, dtype=F64, generator=gen(14))
    Z = M
    for _ in range(40):
        Z = P.normal_correction(Z)
    for m, z in zip(M, Z, strict=True):
        u = polar(m.numpy().T)[0].T  # scipy's polar wants tall matrices
        np.testing.assert_allclose(z.numpy(), u, atol=1e-12)


@pytest.mark.parametrize("n", [7, 5, 3])  # n >= 2p: the four-product relative gradient; n < 2p: the two-product one
def test_fused_update_equals_the_two_halves(n):
    X = P.random_stiefel((2, 5), 3, n, dtype=F64, generator=gen(30))
    D = torch.randn(X.shape, dtype=F64, generator=gen(31))
    for lr, lam in ((0.1, 0.5), (0.7, 0.3)):
        want = P.normal_correction(X - lr * P.relative_gradient(X, D), lam)
        torch.testing.assert_close(P.pogo_update(X.reshape(10, 3, n), D.reshape(10, 3, n), lr, lam),
                                   want.reshape(10, 3, n), atol=1e-14, rtol=0)  # fused bmm/baddbmm path
        torch.testing.assert_close(P.pogo_update(X, D, lr, lam), want)  # general (..., p, n) path


@pytest.mark.parametrize("n", [6, 9])
def test_blocked_step_equals_the_one_batch_step_and_runs_in_place(n):
    # the CPU step runs in cache-sized blocks of matrices: blocks of 1, about 7 and all matrices give the same
    # numbers, also written into X itself and into a transposed (non-contiguous) view
    X = P.random_stiefel(23, 4, n, dtype=F64, generator=gen(32))
    D = torch.randn(X.shape, dtype=F64, generator=gen(33))
    want = P.normal_correction(X - 0.2 * P.relative_gradient(X, D))
    per_matrix = X.element_size() * (4 * 4 * n + 3 * n * n)
    for block_bytes in (1, 7 * per_matrix, 0, None):
        torch.testing.assert_close(P.pogo_update(X, D, 0.2, block_bytes=block_bytes), want, atol=1e-14, rtol=0)
        Y = X.clone()
        assert P.pogo_update(Y, D, 0.2, out=Y, block_bytes=block_bytes) is Y
        torch.testing.assert_close(Y, want, atol=1e-14, rtol=0)
        T = X.mT.contiguous().mT  # same values, transposed strides
        P.pogo_update(T, D, 0.2, out=T, block_bytes=block_bytes)
        torch.testing.assert_close(T, want, atol=1e-14, rtol=0)
    assert _block_size(X.float(), None) == 23  # 23 small matrices fit in one block
    assert _block_size(torch.zeros(10_000, 16, 16), None) == P.CPU_BLOCK_BYTES // (4 * 7 * 256)
    assert _block_size(torch.zeros(10_000, 16, 64), None) == P.CPU_BLOCK_BYTES // (4 * (4 * 16 * 64 + 3 * 256))
    assert _block_size(torch.zeros(10_000, 16, 64, device="meta"), None) == 10_000  # off the CPU: one block
    with pytest.raises(ValueError, match="out has shape"):
        P.pogo_update(X, D, 0.2, out=X[:3])


@pytest.mark.parametrize("rows", [True, False])
def test_optimiser_steps_in_place_and_blocked_like_one_batch(rows):
    loss = quadratic_problem(40, 3, 5, seed=34)
    X0 = P.random_stiefel(40, 3, 5, rows=rows, dtype=F64, generator=gen(35))
    out = []
    for block_bytes in (200, 0):  # 200 bytes: one matrix per block
        X = X0.clone().requires_grad_()
        ptr = X.data_ptr()
        opt = P.POGO([X], lr=0.1, base=P.SGDBase(momentum=0.5), block_bytes=block_bytes, rows=rows)
        for _ in range(5):
            opt.zero_grad()
            loss(X if rows else X.mT).backward()
            opt.step()
        assert X.data_ptr() == ptr
        out.append(X.detach())
    torch.testing.assert_close(out[0], out[1], atol=1e-14, rtol=0)
    with pytest.raises(ValueError, match="block_bytes"):
        P.POGO([X0.clone().requires_grad_()], lr=0.1, block_bytes=-1)


def test_normal_correction_accepts_one_lambda_per_matrix():
    M = perturbed(P.random_stiefel(3, 2, 4, dtype=F64, generator=gen(15)), 0.1, 16)
    lam = torch.tensor([0.0, 0.5, 1.0], dtype=F64)
    out = P.normal_correction(M, lam)
    for i in range(3):
        torch.testing.assert_close(out[i], P.normal_correction(M[i], float(lam[i])))


# ---------------------------------------------------------------------------------------------------------
# The optimiser against pogo-torch (PyPI), step for step


BASES = {
    "sgd": (lambda: P.SGDBase(), lambda b: b.SGD()),
    "momentum": (lambda: P.SGDBase(momentum=0.9), lambda b: b.SGD(momentum=0.9)),
    "nesterov": (lambda: P.SGDBase(momentum=0.9, nesterov=True), lambda b: b.SGD(momentum=0.9, nesterov=True)),
    "dampening": (lambda: P.SGDBase(momentum=0.5, dampening=0.3), lambda b: b.SGD(momentum=0.5, dampening=0.3)),
    "vector_adam": (lambda: P.VectorAdamBase(), lambda b: b.VectorAdam()),
}


@pytest.mark.parametrize("rows", [True, False])
@pytest.mark.parametrize("base", list(BASES))
def test_matches_pogo_torch_step_for_step(base, rows):
    pogo_ref, ref_base, _ = import_reference()

    b, p, n, lr = 6, 4, 7, (0.05 if base in ("sgd", "vector_adam") else 0.005)
    loss = quadratic_problem(b, p, n, seed=1)
    X0 = P.random_stiefel(b, p, n, rows=rows, dtype=F64, generator=gen(2))
    ours, ref = X0.clone().requires_grad_(), X0.clone().requires_grad_()
    opt = P.POGO([ours], lr=lr, base=BASES[base][0](), rows=rows, weight_decay=0.01)
    opt_ref = pogo_ref.POGO([ref], BASES[base][1](ref_base), lr, rows=rows, weight_decay=0.01)
    worst = 0.0
    for _ in range(40):
        for X, o in ((ours, opt), (ref, opt_ref)):
            o.zero_grad()
            loss(X if rows else X.mT).backward()
            o.step()
        worst = max(worst, float((ours.detach() - ref.detach()).abs().max()))
    assert worst < 1e-12
    assert float((ours.detach() - X0).abs().max()) > 1e-2  # it did move


def test_pytorch_style_momentum_init_differs_from_the_public_one():
    loss = quadratic_problem(2, 3, 5, seed=3)
    X0 = P.random_stiefel(2, 3, 5, dtype=F64, generator=gen(4))
    out = []
    for public in (True, False):
        X = X0.clone().requires_grad_()
        opt = P.POGO([X], lr=0.01, base=P.SGDBase(momentum=0.9, public_init=public))
        loss(X).backward()
        opt.step()
        out.append(X.detach())
    G = grad_of(loss, X0)
    torch.testing.assert_close(out[0], P.pogo_update(X0, 1.9 * G, 0.01))
    torch.testing.assert_close(out[1], P.pogo_update(X0, G, 0.01))


def test_muon_base_orthogonalises_each_matrix():
    loss = quadratic_problem(5, 3, 6, seed=5)
    X0 = P.random_stiefel(5, 3, 6, dtype=F64, generator=gen(6))
    X = X0.clone().requires_grad_()
    opt = P.POGO([X], lr=0.05, base=P.MuonBase(momentum=0.0, nesterov=False))
    loss(X).backward()
    G = X.grad.clone()
    opt.step()
    per_matrix = torch.stack([newton_schulz5(g) for g in G])  # each matrix on its own
    torch.testing.assert_close(X.detach(), P.pogo_update(X0, per_matrix, 0.05))
    for _ in range(30):
        opt.zero_grad()
        loss(X).backward()
        opt.step()
    assert float(P.orthogonality_error(X.detach()).max()) < 1e-6


def test_leading_dims_and_two_dimensional_parameters():
    X0 = P.random_stiefel((2, 3), 2, 5, dtype=F64, generator=gen(7))
    G = torch.randn(X0.shape, dtype=F64, generator=gen(8))
    X = X0.clone().requires_grad_()
    X.grad = G.clone()
    single = X0[1, 2].clone().requires_grad_()
    single.grad = G[1, 2].clone()
    P.POGO([X, single], lr=0.1, base=P.VectorAdamBase()).step()
    assert X.shape == (2, 3, 2, 5)
    torch.testing.assert_close(X.detach()[1, 2], single.detach())
    torch.testing.assert_close(X.detach().reshape(6, 2, 5), P.pogo_update(X0.reshape(6, 2, 5),
                                                                         G.reshape(6, 2, 5) / G.reshape(6, 10).norm(
                                                                             dim=1)[:, None, None], 0.1),
                               atol=1e-6, rtol=0)  # VectorAdam's first direction is g/‖g‖_F (up to eps)


def test_float32_tracks_float64_and_grad_is_untouched():
    loss = quadratic_problem(50, 8, 8, seed=9)
    X0 = P.random_stiefel(50, 8, 8, dtype=F64, generator=gen(10))
    worst = {}
    for dtype in (torch.float32, F64):
        X = X0.to(dtype).requires_grad_()
        opt = P.POGO([X], lr=0.01, base=P.SGDBase(momentum=0.5), weight_decay=0.1)
        worst[dtype] = 0.0
        for _ in range(100):
            opt.zero_grad()
            loss(X.double()).backward()
            g = X.grad.clone()
            opt.step()
            assert torch.equal(X.grad, g)
            worst[dtype] = max(worst[dtype], float(P.orthogonality_error(X.detach()).max()))
        assert X.dtype == dtype
    assert worst[torch.float32] <= worst[F64] + 1e-5 and worst[F64] < 1e-3


# ---------------------------------------------------------------------------------------------------------
# Bad input


def test_not_orthonormal_at_the_first_step_raises_with_the_error_size():
    X = torch.randn(4, 3, 5, generator=gen(11)).requires_grad_()
    X.grad = torch.ones_like(X)
    err = float(P.orthogonality_error(X.detach()).max())
    with pytest.raises(ValueError, match=f"{err:.3g}"):
        P.POGO([X], lr=0.1).step()
    P.POGO([X], lr=0.1, check_tol=None, drift_tol=None).step()  # explicitly disabled (and off the manifold)


def test_drift_off_the_manifold_warns_with_the_bound():
    """D12: with the SGD base, lr 0.1 and gradients of 1e3 per entry, one step takes X ~1e13 from orthonormal; the
    optimiser now says so (after step 1 and every check_every steps) instead of diverging silently. A gradient
    within the bound (lr ||R||_2 << 1) stays silent; drift_tol=None turns the check off."""
    for shape, rows in (((4, 3, 5), True), ((2, 6, 6), True), ((3, 7, 2), False)):
        X0 = P.random_stiefel(shape[0], *sorted(shape[1:]), generator=gen(12), dtype=F64)
        X0 = X0 if rows else X0.mT.contiguous()
        big = X0.clone().requires_grad_()
        big.grad = torch.full_like(big, 1e3)
        with pytest.warns(RuntimeWarning, match=r"parameter 0 of group 0 is .* from orthonormal .* step 1.*lr \*"):
            P.POGO([big], lr=0.1, rows=rows).step()
        assert float(P.orthogonality_error(big.detach() if rows else big.detach().mT).max()) > 1.0  # it did drift
        small = X0.clone().requires_grad_()
        opt = P.POGO([small], lr=0.1, rows=rows, check_every=2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(4):
                small.grad = torch.randn(small.shape, generator=gen(13), dtype=F64)
                opt.step()
            off = X0.clone().requires_grad_()
            off.grad = torch.full_like(off, 1e3)
            P.POGO([off], lr=0.1, rows=rows, drift_tol=None).step()
    with pytest.raises(ValueError, match="drift_tol"):
        P.POGO([X0.clone().requires_grad_()], lr=0.1, rows=False, drift_tol=0)
    with pytest.raises(ValueError, match="check_every"):
        P.POGO([X0.clone().requires_grad_()], lr=0.1, rows=False, check_every=0)


def test_shape_and_hyper_parameter_errors():
    tall = torch.zeros(2, 5, 3, requires_grad=True)
    with pytest.raises(ValueError, match="rows=False"):
        P.POGO([tall], lr=0.1)
    with pytest.raises(ValueError, match="rows=True"):
        P.POGO([torch.zeros(2, 3, 5, requires_grad=True)], lr=0.1, rows=False)
    with pytest.raises(ValueError, match="matrices"):
        P.POGO([torch.zeros(5, requires_grad=True)], lr=0.1)
    ok = P.random_stiefel(2, 3, 5).requires_grad_()
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="learning rate"):
            P.POGO([ok], lr=bad)
    with pytest.raises(ValueError, match="weight_decay"):
        P.POGO([ok], lr=0.1, weight_decay=-1)
    with pytest.raises(ValueError, match="Nesterov"):
        P.SGDBase(nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        P.VectorAdamBase(betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="rows=False"):
        P.Landing([tall], lr=0.1)
    with pytest.raises(ValueError, match="differs"):
        P.relative_gradient(ok.detach(), torch.zeros(2, 3, 4))


# ---------------------------------------------------------------------------------------------------------
# Quartic λ


def test_quartic_lambda_minimises_the_residual():
    *_, compute_lambda = import_reference()  # the public code's λ, as a comparison point

    X = P.random_stiefel(30, 5, 9, dtype=F64, generator=gen(12))
    grid = torch.linspace(-1, 2, 30001, dtype=F64)
    for lr in (0.05, 0.3, 1.0):
        M = X - lr * P.relative_gradient(X, torch.randn(X.shape, dtype=F64, generator=gen(13)))
        B = M - M @ M.mT @ M
        lam = P.solve_lambda_quartic(M, B)
        c = P.quartic_coefficients(M, B)
        explicit = torch.linalg.matrix_norm((M + lam[:, None, None] * B) @ (M + lam[:, None, None] * B).mT
                                            - torch.eye(5, dtype=F64)).square()
        torch.testing.assert_close(_polyval(c, lam[:, None])[:, 0], explicit)
        f_grid = _polyval(c, grid.expand(30, -1)).amin(-1)
        f_half = _polyval(c, torch.full((30, 1), 0.5, dtype=F64))[:, 0]
        f_public = _polyval(c, compute_lambda(M, B).to(F64)[:, None])[:, 0]
        assert (explicit <= f_grid + 1e-9 * (1 + f_grid)).all()
        assert (explicit <= f_half * (1 + 1e-12) + 1e-15).all()
        assert (explicit <= f_public * (1 + 1e-12) + 1e-15).all()
        for i in range(3):  # the critical points are numpy's roots of f'
            roots = np.roots(np.polyder(c[i].numpy()))
            real = roots[np.abs(roots.imag) < 1e-8].real
            assert np.min(np.abs(real - float(lam[i]))) < 1e-6


def test_quartic_lambda_with_zero_normal_part_and_in_the_optimiser():
    X = P.random_stiefel(4, 3, 6, dtype=F64, generator=gen(14))
    lam = P.solve_lambda_quartic(X, X - X @ X.mT @ X)
    torch.testing.assert_close(lam, torch.full((4,), 0.5, dtype=F64))
    loss = quadratic_problem(4, 3, 6, seed=15)
    errs = {}
    for every in (-1, 1):
        Z = X.clone().requires_grad_()
        opt = P.POGO([Z], lr=0.5, lambda_every=every, drift_tol=None)  # λ = ½ drifts by 0.3 here, on purpose
        worst = 0.0
        for _ in range(20):
            opt.zero_grad()
            loss(Z).backward()
            opt.step()
            worst = max(worst, float(P.orthogonality_error(Z.detach()).max()))
        errs[every] = worst
    assert errs[1] <= errs[-1]


# ---------------------------------------------------------------------------------------------------------
# Landing


def landing_square_reference(X, G, lr, lam=1.0, eps=0.5, reg=1e-7):
    """pierreablin/landing's step for square matrices, written out: ψ = skew(G Xᵀ), field (ψ + λ(XXᵀ − I)) X,
    safe step from the distance and the field's norm."""
    out = []
    for x, g in zip(X, G, strict=True):
        psi = 0.5 * (g @ x.T - x @ g.T)
        dist = x @ x.T - torch.eye(x.shape[0], dtype=x.dtype)
        field = (psi + lam * dist) @ x
        d, a = float(torch.linalg.norm(dist)), float(torch.linalg.norm(field)) ** 2
        beta = lam * d * (1 - d)
        step = min((beta + np.sqrt(beta**2 + max(a * (eps - d), 0.0))) / (a + reg), 1 / (2 * lam), lr)
        out.append(x - step * field)
    return torch.stack(out)


def test_landing_matches_the_square_reference():
    loss = quadratic_problem(5, 6, 6, seed=16)
    X0 = P.random_stiefel(5, 6, 6, dtype=F64, generator=gen(17))
    G = grad_of(loss, X0)
    X = X0.clone().requires_grad_()
    X.grad = G.clone()
    P.Landing([X], lr=0.2).step()
    torch.testing.assert_close(X.detach(), landing_square_reference(X0, G, 0.2), atol=1e-13, rtol=0)
    # off the manifold the row-aware and the square forms differ only at second order in the distance
    X1 = X.detach()
    G1 = grad_of(loss, X1)
    X.grad = G1.clone()
    P.Landing([X], lr=0.2).step()
    d = float(P.orthogonality_error(X1).max())
    gap = float((X.detach() - landing_square_reference(X1, G1, 0.2)).abs().max())
    assert gap <= 0.2 * d * float(G1.abs().max()) * 6


def test_landing_safe_step_keeps_the_distance_below_eps():
    loss = quadratic_problem(20, 5, 5, seed=18)
    X = P.random_stiefel(20, 5, 5, dtype=F64, generator=gen(19)).requires_grad_()
    opt = P.Landing([X], lr=10.0, safe_step=0.5)
    worst = 0.0
    for _ in range(50):
        opt.zero_grad()
        loss(X).backward()
        opt.step()
        worst = max(worst, float(P.orthogonality_error(X.detach()).max()))
    assert 1e-3 < worst <= 0.5


def test_landing_is_not_frozen_on_wide_pca():
    # PCA on wide row matrices: the square-matrix relative gradient would be exactly zero here
    n, p = 12, 3
    A = torch.randn(n, n, dtype=F64, generator=gen(20))
    A = A @ A.T / n

    def f(Z):
        return -0.5 * torch.trace(Z[0] @ A @ Z[0].T)

    X = P.random_stiefel(1, p, n, dtype=F64, generator=gen(21)).requires_grad_()
    opt = P.Landing([X], lr=0.2)
    f0 = float(f(X.detach()))
    for _ in range(300):
        opt.zero_grad()
        f(X).backward()
        opt.step()
    f_star = -0.5 * float(torch.linalg.eigvalsh(A)[-p:].sum())
    assert (float(f(X.detach())) - f_star) < 1e-3 * (f0 - f_star)
    assert float(P.orthogonality_error(X.detach()).max()) < 1e-4  # Landing only lands asymptotically


def test_landing_columns_equal_rows_transposed():
    X0 = P.random_stiefel(3, 2, 5, dtype=F64, generator=gen(22))
    G = torch.randn(X0.shape, dtype=F64, generator=gen(23))
    a, b = X0.clone().requires_grad_(), X0.mT.clone().requires_grad_()
    a.grad, b.grad = G.clone(), G.mT.clone()
    P.Landing([a], lr=0.1, momentum=0.5).step()
    P.Landing([b], lr=0.1, momentum=0.5, rows=False).step()
    torch.testing.assert_close(a.detach(), b.detach().mT)


# ---------------------------------------------------------------------------------------------------------
# Devices


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    loss = quadratic_problem(8, 4, 6, seed=24)
    X0 = P.random_stiefel(8, 4, 6, dtype=F64, generator=gen(25))
    out = []
    for dev in ("cpu", "cuda"):
        X = X0.to(dev).clone().requires_grad_()
        opt = P.POGO([X], lr=0.05, base=P.VectorAdamBase(), lambda_every=3)
        for _ in range(10):
            opt.zero_grad()
            X.grad = grad_of(loss, X.detach().cpu()).to(dev)
            opt.step()
        out.append(X.detach().cpu())
    torch.testing.assert_close(out[0], out[1], atol=1e-10, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# The notebook's problems and harness (repro.papers.pogo.problems, .experiment)


def test_problem_optima_against_numpy_and_scipy():
    pca = P.PCAProblem.generate(12, 3, cond=100.0, generator=gen(40), dtype=F64)
    eig, vec = np.linalg.eigh(pca.A.numpy())
    assert pca.f_star == pytest.approx(-0.5 * eig[-3:].sum(), rel=1e-12)
    top = torch.from_numpy(vec[:, -3:].copy())[None]
    assert pca.gap(top) < 1e-12 and pca.gap(pca.init(gen(41))) > 1e-3
    proc = P.ProcrustesProblem.generate(5, 4, 8, noise=0.1, generator=gen(42), dtype=F64)
    best = np.stack([polar(b @ a.T)[0] for a, b in zip(proc.A.numpy(), proc.B.numpy(), strict=True)])
    assert proc.f_star == pytest.approx(0.5 * float(((best @ proc.A.numpy() - proc.B.numpy()) ** 2).sum()), rel=1e-12)
    assert proc.gap(torch.from_numpy(best)) < 1e-12
    start = proc.init(gen(43))
    np.testing.assert_array_equal(np.sign(np.linalg.det(start.numpy())), np.sign(np.linalg.det(best)))


def test_every_method_of_the_sweep_reaches_the_procrustes_optimum():
    prob = P.ProcrustesProblem.generate(4, 4, 8, noise=0.1, generator=gen(3), dtype=F64)
    X0 = prob.init(gen(4))
    lrs = [0.1, 0.3, 1.0]
    res = P.sweep(prob, X0, 80, rows=True, lrs=lrs)
    best = P.best_lrs(res, lrs)
    assert list(best) == P.METHODS
    for m, lr in best.items():
        r = res[m, lr]
        assert r.final_gap < 1e-3 < r.gap[0], (m, lr, r.final_gap)  # the gap's reference: scipy's polar optimum
        assert set(np.flatnonzero(np.isfinite(r.gap))) == P.eval_steps(80)
    assert max(res[m, best[m]].worst_orth for m in P.GEOOPT_METHODS + ["Adam + SVD"]) < 1e-12  # retractions
    table = P.summary_table(res, best)
    assert list(table.index) == P.METHODS and (table["ms_per_step"] > 0).all()


def test_run_method_stops_when_it_diverges():
    prob = P.ProcrustesProblem.generate(2, 4, 8, generator=gen(5), dtype=F64)
    r = P.run_method(prob, "POGO (SGD-mom 0.3)", 30.0, prob.init(gen(6)), 50, rows=True)
    stop = int(np.flatnonzero(np.isfinite(r.orth))[-1])
    assert 1 <= stop < 50 and not r.orth[stop] < P.DIVERGED and np.isnan(r.final_gap)
    assert np.isnan(r.gap[stop:]).all() and np.isnan(r.orth[stop + 1:]).all()
    res = {("POGO (SGD)", lr): r for lr in (1.0,)} | {("POGO (SGD)", 0.1): P.run_method(
        prob, "POGO (SGD)", 0.1, prob.init(gen(6)), 50, rows=True)}
    assert P.best_lrs(res, [1.0, 0.1], methods=["POGO (SGD)"]) == {"POGO (SGD)": 0.1}  # a diverged run never wins
    assert P.eval_steps(50) >= {0, 1, 2, 50} and len(P.eval_steps(1000)) < 70


def fake_run(final_gap: float, worst_orth: float) -> P.Trajectory:
    return P.Trajectory(gap=np.array([1.0, final_gap]), orth=np.array([0.0, worst_orth]), clock=np.zeros(2),
                        final_gap=final_gap, worst_orth=worst_orth, final_orth=worst_orth, ms_per_step=1.0)


def test_claim_numbers_by_hand():
    lrs = [0.1, 1.0]
    res = {(m, lr): fake_run(1e-3, 1e-4) for m in P.METHODS for lr in lrs}
    res["POGO (SGD)", 0.1] = fake_run(4e-3, 2e-4)
    res["Landing", 0.1] = fake_run(2e-3, 1e-2)
    res["POGO (VectorAdam)", 1.0] = fake_run(1e-9, 5.0)  # outside lr <= 0.1, floored at 1e-6 for the best gap
    res["POGO (SGD-mom 0.3)", 0.1] = fake_run(float("nan"), 3e-3)  # diverged: out of the best gaps
    res["geoopt RAdam (QR)", 1.0] = fake_run(5e-7, 1e-15)
    n = P.claim_numbers(res, lrs, lr_max=0.1)
    assert n["worst_by_base"] == {"POGO (SGD)": 2e-4, "POGO (SGD-mom 0.3)": 3e-3, "POGO (VectorAdam)": 1e-4}
    assert n["worst_pogo"] == 3e-3
    assert n["landing_ratio"] == pytest.approx(1e-2 / 2e-4)
    assert n["gap_ratio"] == pytest.approx(4e-3 / 2e-3)
    assert n["geoopt_over_pogo"] == pytest.approx(1e-6 / 1e-6)
    assert n["geoopt_over_pogo_raw"] == pytest.approx(5e-7 / 1e-9)  # no floor: POGO (VectorAdam)'s 1e-9 wins
    # best learning rates of the bases (smallest final gap over the grid; the diverged run is out)
    assert n["best_lr_by_base"] == {"POGO (SGD)": 1.0, "POGO (SGD-mom 0.3)": 1.0, "POGO (VectorAdam)": 1.0}
    assert n["worst_at_best_by_base"] == {"POGO (SGD)": 1e-4, "POGO (SGD-mom 0.3)": 1e-4, "POGO (VectorAdam)": 5.0}
    assert n["worst_at_best"] == 5.0
    # the controls: Landing's worst error at lr <= 0.1 (only 0.1 here) and at its best lr (1.0: gap 1e-3 < 2e-3)
    assert n["landing_worst"] == 1e-2 and n["landing_worst_at_best"] == 1e-4
    assert P.best_summary(res, {"Landing": 0.1}) == {"Landing": {"lr": 0.1, "final_gap": 2e-3, "worst_orth": 1e-2}}
    with pytest.raises(ValueError, match="<= 0.01"):
        P.claim_numbers(res, lrs, lr_max=0.01)


def test_match_public_agrees_with_pogo_torch():
    import_reference()
    for kind in ("sgd", "vectoradam"):
        dev, gap = P.match_public(*P.public_base_pair(kind), 0.05, n=12, p=4, steps=10, seed=7)
        assert dev < 1e-12 and 0 < gap < 1
    assert P.match_digits(1.4e-15) == P.MATCH_DIGITS_CAP == 12 and P.match_digits(0.0) == 12
    assert P.match_digits(1.4e-15, cap=16) == 14 and P.match_digits(2e-5) == 4
    with pytest.raises(ValueError, match="unknown base"):
        P.public_base_pair("adam")


def test_time_to_a_target_gap():
    prob = P.ProcrustesProblem.generate(6, 4, 8, noise=0.1, generator=gen(11), dtype=F64)
    X0 = prob.init(gen(12))
    best = {"POGO (SGD)": 0.3, "geoopt RSGD (QR)": 0.3, "geoopt RSGD (Cayley)": 1e-4}  # the last is too slow
    runs = P.time_to_gap(prob, X0, best, 1e-3, 200, rows=True)
    for m in ("POGO (SGD)", "geoopt RSGD (QR)"):
        steps, secs = P.reached(runs[m], 1e-3)
        r = runs[m]
        assert 1 <= steps < 200 and r.gap[steps] <= 1e-3 < np.nanmin(r.gap[:steps])  # the first step at the target
        assert np.isfinite(r.gap[: steps + 1]).all() and np.isnan(r.gap[steps + 1 :]).all()  # evaluated every step
        assert secs == r.clock[steps] > 0
    assert P.reached(runs["geoopt RSGD (Cayley)"], 1e-3) == (-1, float("inf"))
    s = P.speed_to_target(runs, 1e-3)
    assert s["ratio"] == pytest.approx(s["seconds"]["geoopt RSGD (QR)"] / s["seconds"]["POGO (SGD)"])
    assert s["steps"]["geoopt RSGD (Cayley)"] == -1 and s["seconds"]["geoopt RSGD (Cayley)"] is None
    assert s["fastest_pogo_s"] == s["seconds"]["POGO (SGD)"]
    assert P.speed_to_target({"geoopt RSGD (QR)": runs["geoopt RSGD (QR)"]}, 1e-3)["ratio"] == 0.0
    assert P.speed_to_target({"POGO (SGD)": runs["POGO (SGD)"]}, 1e-3)["ratio"] == float("inf")


def test_contraction_is_quadratic():
    c = P.contraction(b=6, p=3, n=5, points=8, iters=6, seed=8)
    assert c.d0.shape == c.d1.shape == (48,)
    assert 1.9 <= c.slope <= 2.1  # analytic: s -> 1.5 s - 0.5 s^3 squares the distance
    # each singular value 1 + e maps to 1 - 1.5 e^2: d1 = 3 sqrt(sum e^4) and d0^2 = 4 sum e^2, so the constant
    # d1 / d0^2 lies in [3/4 / sqrt(p), 3/4] (up to the noise and higher orders)
    assert 0.9 * 0.75 / np.sqrt(3) <= np.exp(c.intercept) <= 1.1 * 0.75
    assert c.chain[-1] < 1e-13 and all(b < a**2 for a, b in zip(c.chain[:4], c.chain[1:5], strict=True))


def test_time_per_step_and_scaling_summary():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert P.step_clock("cpu")[0] == "CPU time"  # one thread: CPU time, which other jobs do not inflate
        torch.set_num_threads(2)
        assert P.step_clock("cpu")[0] == "wall clock"
    finally:
        torch.set_num_threads(threads)
    ms = P.time_per_step([2, 3], 4, budget_s=1e-3, repeats=1, generator=gen(9))
    assert list(ms) == P.SCALE_METHODS and all(len(v) == 2 and min(v) > 0 for v in ms.values())
    counts = [10, 100, 1000, 10000]
    step = {"POGO": [0.1 * c**0.5 for c in counts], "geoopt RSGD (QR)": [1.0] * 4, "geoopt RSGD (Cayley)": [2.0] * 4}
    s = P.scaling_summary(counts, step)
    assert s["growth"] == pytest.approx(0.5) and s["qr_ratio"] == pytest.approx(1 / (0.1 * 1000**0.5))
    assert s["cayley_ratio"] == pytest.approx(2 * s["qr_ratio"])


def test_baselines_reject_bad_input():
    X = P.random_stiefel(2, 3, 5, dtype=F64, generator=gen(10))
    with pytest.raises(ValueError, match="unknown method"):
        P.make_optimizer("SGD", X, 0.1, rows=True)
    with pytest.raises(ValueError, match="column-orthonormal"):
        P.make_optimizer("geoopt RSGD (QR)", X, 0.1, rows=True)
    with pytest.raises(ValueError, match="unknown method"):
        P.stepper("geoopt RAdam (QR)", X, X)
    with pytest.raises(ValueError, match="steps"):
        P.run_method(P.ProcrustesProblem.generate(1, 3, 4, generator=gen(1)), "POGO (SGD)", 0.1, X, 0, rows=True)


# ---------------------------------------------------------------------------------------------------------
# The triangular Gram of the fused step and the FLOP counts of the benchmark's roofline (issue 43)


@pytest.mark.parametrize("block_rows", [0, 1, 2, 3, 5, 7, 12])
def test_triangular_gram_equals_the_full_product(block_rows):
    X = torch.randn(2, 3, 7, 19, dtype=F64, generator=gen(60))  # two batch axes, 7 rows: ragged last blocks
    S = P.gram(X, block_rows)
    torch.testing.assert_close(S, X @ X.mT, atol=1e-13, rtol=0)
    if 0 < block_rows < 7:  # below the diagonal blocks: the mirror of the blocks above
        below = torch.ones(7, 7, dtype=torch.bool).tril(-1) & (torch.arange(7)[:, None] // block_rows
                                                               > torch.arange(7)[None, :] // block_rows)
        assert torch.equal(S[..., below], S.mT[..., below])
    with pytest.raises(ValueError, match="block_rows"):
        P.gram(X, -1)


def test_gram_block_rule():
    r = P.GRAM_BLOCK_ROWS
    assert P.gram_block_rows(4 * r - 1) == 0 and P.gram_block_rows(4 * r) == r  # at least four blocks, on the CPU
    assert P.gram_block_rows(1024, "meta") == 0  # off the CPU: one product
    assert P.gram_block_rows(5, "cpu", 2) == 2 and P.gram_block_rows(1024, "cpu", 0) == 0
    with pytest.raises(ValueError, match="gram_rows"):
        P.gram_block_rows(8, "cpu", -1)


@pytest.mark.parametrize("p,n", [(6, 15), (6, 8)])  # the wide form (n >= 2p) and the square form
def test_fused_step_with_triangular_grams(p, n):
    # the same step as the two halves whatever the blocks; in the optimiser too, in place and out of place (rows)
    X = P.random_stiefel(5, p, n, dtype=F64, generator=gen(61))
    D = torch.randn(X.shape, dtype=F64, generator=gen(62))
    want = P.normal_correction(X - 0.3 * P.relative_gradient(X, D))
    for rows in (0, 1, 4, None):
        torch.testing.assert_close(P.pogo_update(X, D, 0.3, gram_rows=rows), want, atol=1e-14, rtol=0)
    loss = quadratic_problem(5, p, n, seed=63)
    for orient in (True, False):
        out = []
        for rows in (0, 4):
            W = (X if orient else X.mT).clone().requires_grad_()
            opt = P.POGO([W], lr=0.1, base=P.SGDBase(momentum=0.5), rows=orient, gram_rows=rows)
            for _ in range(4):
                opt.zero_grad()
                loss(W if orient else W.mT).backward()
                opt.step()
            out.append(W.detach())
        torch.testing.assert_close(out[0], out[1], atol=1e-14, rtol=0)
    with pytest.raises(ValueError, match="gram_rows"):
        P.POGO([X.clone().requires_grad_()], lr=0.1, gram_rows=-1)


def _counted_flops(step) -> int:
    """FLOPs of the matrix products ``step()`` runs, by torch's FlopCounterMode. Its registry has ``baddbmm`` but
    not the in-place ``baddbmm_`` (POGO's fused step uses it once): that one is counted here as ``2·b·m·k·n``."""
    from torch.utils.flop_counter import FlopCounterMode

    def inplace_baddbmm(self_shape, a_shape, b_shape, *args, **kwargs) -> int:
        b, m, k = a_shape
        return 2 * b * m * k * b_shape[-1]

    with FlopCounterMode(display=False, custom_mapping={torch.ops.aten.baddbmm_: inplace_baddbmm}) as counter:
        step()
    return counter.get_total_flops()


@pytest.mark.parametrize("b,p,n,rows", [(3, 5, 12, None), (2, 12, 30, 5), (4, 6, 8, 4), (2, 7, 7, None),
                                        (1, 256, 512, None)])  # wide, triangles of 5 rows, square; auto triangles
def test_pogo_flops_match_the_torch_flop_counter(b, p, n, rows):
    F = P.flops
    X = P.random_stiefel(b, p, n, generator=gen(64))
    D = torch.randn(X.shape, generator=gen(65))
    want = F.pogo_flops(b, p, n, gram_rows=rows)
    assert _counted_flops(lambda: P.pogo_update(X, D, 0.1, gram_rows=rows)) == want
    assert _counted_flops(lambda: P.pogo_update(X, D, 0.1, gram_rows=rows, block_bytes=1)) == want  # blocked
    W = X.clone().requires_grad_()
    W.grad = D
    step = P.POGO([W], lr=0.1, gram_rows=rows, drift_tol=None, check_tol=None).step
    assert _counted_flops(step) == want  # the optimiser adds no product
    full, tri = F.pogo_flops(1, 512, 1024, gram_rows=0), F.pogo_flops(1, 512, 1024)
    assert full == 12 * 512**2 * 1024 and tri == 10.25 * 512**2 * 1024 and F.pogo_torch_flops(1, 512, 1024) == full


def test_baseline_flops_match_the_torch_flop_counter():
    # Landing and pogo-torch: every FLOP is a product; geoopt: the products are counted, QR and the solve are not
    F = P.flops
    b, p, n = 3, 4, 10
    X0 = P.random_stiefel(b, p, n, generator=gen(66))
    G = torch.randn(X0.shape, generator=gen(67))
    X = X0.clone().requires_grad_()
    X.grad = G.clone()
    assert _counted_flops(P.Landing([X], lr=0.1).step) == F.landing_flops(b, p, n) == 8 * b * p * p * n
    reference, base, _ = import_reference()
    X = X0.clone().requires_grad_()
    X.grad = G.clone()
    assert _counted_flops(reference.POGO([X], base.SGD(), 0.1).step) == F.pogo_torch_flops(b, p, n)
    geoopt = P.import_geoopt()
    lapack = {"QR": 2 * (2 * n * p * p - 2 * p**3 / 3), "Cayley": 2 * n**3 / 3 + 2 * n * n * p}  # per matrix
    for kind, manifold, count in (("QR", geoopt.EuclideanStiefel(), F.geoopt_qr_flops),
                                  ("Cayley", geoopt.CanonicalStiefel(), F.geoopt_cayley_flops)):
        X = geoopt.ManifoldParameter(X0.mT.clone(), manifold=manifold)
        X.grad = G.mT.clone()
        products = _counted_flops(geoopt.optim.RiemannianSGD([X], lr=0.1).step)
        assert products == pytest.approx(count(b, p, n) - b * lapack[kind])
    assert F.step_bytes(b, p, n) == 3 * b * p * n * 4
    assert set(F.FLOPS) == set(F.WORK)
