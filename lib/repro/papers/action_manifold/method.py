"""GAM's two invariances as batched torch geometry: the Arc-Length Parameterizer and the Schema-Affine-Factorization.

Paper: H. Lyu, C. Chen, M. Cao, Y. Ji, C. Xu, "General Covariant Action Modeling: Constructing Generalized Manifolds
via Spatio-Temporal Decoupling", ICML 2026 (arXiv 2606.00110). The abstract names the two mechanisms; their equations
are not public, so the forms below are the standard ones (spec ``13-gam-action-manifold.md`` §1, *inferred*):

* **Arc-length parameterizer** (temporal invariance). For samples ``x_0..x_{T-1}``: chord lengths
  ``l_k = |x_k − x_{k−1}|``, cumulative ``s_k = Σ_{j≤k} l_j``, ``L = s_{T−1}``, ``u_k = s_k / L``. The spatial path
  ``P(σ)`` is the polyline through the samples read at ``σ_j = j/(n−1)``; the timing ``u`` is kept apart and
  ``x(t) = P(u(t))`` re-executes the path at any speed.
* **Schema-affine factorization on Sim(2)** (geometric invariance). A planar similarity acts as ``z ↦ e^w z + t``
  (complex ``z``; ``w = λ + iθ``: log-scale and angle). Its Lie algebra element is ``ξ = (ρ_x, ρ_y, θ, λ)`` with
  ``exp(ξ)``: ``e^w`` and ``t = φ(w) ρ``, ``φ(w) = (e^w − 1)/w`` (the matrix exponential of
  ``[[λ, −θ, ρ_x], [θ, λ, ρ_y], [0, 0, 0]]``). The pose-normalising element ``g`` of a path (chord frame:
  ``t = P(0)``, ``e^w = P(1) − P(0)``) maps it to the canonical "world line" ``W = g⁻¹·P`` from ``(0, 0)`` to
  ``(1, 0)``: the invariant *schema*; ``ξ = log g`` is the *affine modulation*.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "arclength_resample", "canonical_frame", "chord_frame", "compose", "factorize", "frechet", "path_error",
    "retime", "sim2_act", "sim2_exp", "sim2_inv", "sim2_log", "sim2_matrix", "uniform_grid",
]

_SERIES_RADIUS = 1e-2  # below this |w|, φ(w) = (e^w − 1)/w uses its Taylor series (cancellation otherwise)


def _check_finite(name: str, x: torch.Tensor) -> None:
    if x.numel() == 0:
        raise ValueError(f"{name} is empty")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")


def uniform_grid(n: int, like: torch.Tensor) -> torch.Tensor:
    """``σ_j = j/(n−1)``, ``j = 0..n−1``, on ``like``'s device and dtype."""
    if n < 2:
        raise ValueError(f"need at least 2 points, got n={n}")
    return torch.linspace(0.0, 1.0, n, device=like.device, dtype=like.dtype)


def _interp(s: torch.Tensor, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation of the knots ``(s[..., k], x[..., k, :])`` (``s`` non-decreasing) at
    ``q[..., j]``. Plateaus of ``s`` (zero-length segments) are never chosen as the bracketing segment."""
    T = s.shape[-1]
    # right=True: s[i-1] <= q < s[i], so the bracket has positive length whenever q is inside (pauses skipped)
    i = torch.searchsorted(s.contiguous(), q.contiguous(), right=True).clamp(1, T - 1)
    s0, s1 = s.gather(-1, i - 1), s.gather(-1, i)
    w = ((q - s0) / (s1 - s0).clamp_min(torch.finfo(s.dtype).tiny)).clamp(0.0, 1.0)
    idx = i.unsqueeze(-1).expand(*i.shape, x.shape[-1])
    x0, x1 = x.gather(-2, idx - 1), x.gather(-2, idx)
    return x0 + w.unsqueeze(-1) * (x1 - x0)


def arclength_resample(x: torch.Tensor, n: int, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Arc-Length Parameterizer: split a time-indexed trajectory into path and timing.

    ``x``: ``[..., T, d]`` samples. Returns ``P [..., n, d]`` (the polyline read at equal arc-length fractions
    ``σ_j = j/(n−1)``), ``L [...]`` (total chord length) and ``u [..., T]`` (the arc-length fraction reached at each
    sample: monotone, ``u_0 = 0``, ``u_{T−1} = 1``). Zero-length segments (pauses) are skipped; a trajectory that
    never moves (``L ≤ eps``) has no path and raises."""
    _check_finite("trajectory", x)
    if x.ndim < 2 or x.shape[-2] < 2:
        raise ValueError(f"need a [..., T>=2, d] trajectory, got shape {tuple(x.shape)}")
    seg = (x[..., 1:, :] - x[..., :-1, :]).norm(dim=-1)            # l_k = |x_k − x_{k−1}|
    s = torch.cat([torch.zeros_like(seg[..., :1]), seg.cumsum(-1)], dim=-1)  # s_k = Σ_{j≤k} l_j
    L = s[..., -1]                                                  # L = s_{T−1}
    if (L <= eps).any():
        raise ValueError("a trajectory has zero arc length (it never moves): its path is undefined")
    u = s / L.unsqueeze(-1)                                         # u_k = s_k / L
    sigma = uniform_grid(n, x).expand(*u.shape[:-1], n)
    return _interp(u, x, sigma), L, u


def retime(P: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Execute the path ``P [..., n, d]`` (read at equal fractions ``σ_j = j/(n−1)``) with the timing
    ``u [..., T]`` in ``[0, 1]``: ``x(t) = P(u(t))``, linear between the knots. The leading dims broadcast; returns
    ``[..., T, d]``."""
    _check_finite("path", P)
    _check_finite("timing", u)
    if u.min() < -1e-9 or u.max() > 1 + 1e-9:
        raise ValueError(f"timing u must lie in [0, 1], got [{float(u.min()):.3g}, {float(u.max()):.3g}]")
    n, batch = P.shape[-2], torch.broadcast_shapes(P.shape[:-2], u.shape[:-1])
    P = P.expand(*batch, *P.shape[-2:])
    return _interp(uniform_grid(n, P).expand(*batch, n), P, u.clamp(0.0, 1.0).expand(*batch, u.shape[-1]))


# --------------------------------------------------------------------------------------------------- Sim(2)
def _phi(w: torch.Tensor) -> torch.Tensor:
    """``φ(w) = (e^w − 1)/w`` for complex ``w``, with its Taylor series near 0 (``1 + w/2 + w²/6 + …``)."""
    small = w.abs() < _SERIES_RADIUS
    safe = torch.where(small, torch.ones_like(w), w)
    series = 1 + w / 2 + w**2 / 6 + w**3 / 24 + w**4 / 120 + w**5 / 720
    return torch.where(small, series, (torch.exp(safe) - 1) / safe)  # |w| >= 1e-2: cancellation <= eps/|w|


def sim2_matrix(rot: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The 3×3 matrix of ``z ↦ rot·z + t`` for complex ``rot`` (``= s e^{iθ}``) and ``t`` of shape ``[...]``."""
    a, b, tx, ty = rot.real, rot.imag, t.real, t.imag
    zero, one = torch.zeros_like(a), torch.ones_like(a)
    rows = [torch.stack([a, -b, tx], -1), torch.stack([b, a, ty], -1), torch.stack([zero, zero, one], -1)]
    return torch.stack(rows, -2)


def _complex(xy: torch.Tensor) -> torch.Tensor:
    return torch.complex(xy[..., 0], xy[..., 1])


def _parts(G: torch.Tensor, atol: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """``(e^w, t)`` of a Sim(2) matrix, after checking that it is one (``[[a, −b, x], [b, a, y], [0, 0, 1]]``)."""
    _check_finite("Sim(2) matrix", G)
    if G.shape[-2:] != (3, 3):
        raise ValueError(f"a Sim(2) element is a [..., 3, 3] matrix, got shape {tuple(G.shape)}")
    scale = G[..., :2, :2].abs().amax(dim=(-2, -1)).clamp_min(1.0)
    bad = ((G[..., 0, 0] - G[..., 1, 1]).abs() + (G[..., 0, 1] + G[..., 1, 0]).abs()) > atol * scale
    bad |= (G[..., 2, :] - G.new_tensor([0.0, 0.0, 1.0])).abs().amax(-1) > atol
    if bad.any():
        raise ValueError("not a Sim(2) matrix: need [[a, -b, x], [b, a, y], [0, 0, 1]]")
    rot = torch.complex(G[..., 0, 0], G[..., 1, 0])
    if (rot.abs() == 0).any():
        raise ValueError("a Sim(2) matrix with zero scale has no inverse or logarithm")
    return rot, torch.complex(G[..., 0, 2], G[..., 1, 2])


def sim2_exp(xi: torch.Tensor) -> torch.Tensor:
    """``exp: sim(2) → Sim(2)``. ``xi [..., 4] = (ρ_x, ρ_y, θ, λ)`` → ``[..., 3, 3]`` with rotation-scale
    ``e^w`` (``w = λ + iθ``) and translation ``t = φ(w) ρ`` (closed form of the 3×3 matrix exponential)."""
    _check_finite("xi", xi)
    if xi.shape[-1] != 4:
        raise ValueError(f"xi must be [..., 4] = (rho_x, rho_y, theta, lambda), got shape {tuple(xi.shape)}")
    w = torch.complex(xi[..., 3], xi[..., 2])          # w = λ + iθ
    rho = torch.complex(xi[..., 0], xi[..., 1])
    return sim2_matrix(torch.exp(w), _phi(w) * rho)    # e^w and t = (e^w − 1)/w · ρ


def sim2_log(G: torch.Tensor) -> torch.Tensor:
    """``log: Sim(2) → sim(2)``, the principal branch (``θ ∈ (−π, π]``): ``w = log s + iθ``, ``ρ = t / φ(w)``.
    Returns ``[..., 4] = (ρ_x, ρ_y, θ, λ)``."""
    rot, t = _parts(G)
    w = torch.complex(rot.abs().log(), torch.atan2(rot.imag, rot.real))  # w = log s + iθ
    rho = t / _phi(w)                                                    # ρ = t·w/(e^w − 1)
    return torch.stack([rho.real, rho.imag, w.imag, w.real], -1)


def sim2_inv(G: torch.Tensor) -> torch.Tensor:
    """The inverse similarity ``z ↦ (z − t)/e^w``."""
    rot, t = _parts(G)
    return sim2_matrix(1 / rot, -t / rot)


def sim2_act(G: torch.Tensor, pts: torch.Tensor) -> torch.Tensor:
    """Apply ``G [..., 3, 3]`` to points ``pts [..., m, 2]``: ``A p + t``."""
    _check_finite("points", pts)
    if pts.shape[-1] != 2:
        raise ValueError(f"points must be planar [..., m, 2], got shape {tuple(pts.shape)}")
    return pts @ G[..., :2, :2].transpose(-1, -2) + G[..., None, :2, 2]


def chord_frame(start: torch.Tensor, goal: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """The pose-normalising element of the chord ``start → goal``: ``t = start``, ``e^w = goal − start`` (so it maps
    ``(0, 0) ↦ start`` and ``(1, 0) ↦ goal``). ``[..., 2]`` each → ``[..., 3, 3]``."""
    _check_finite("start", start)
    _check_finite("goal", goal)
    d = _complex(goal - start)
    if (d.abs() <= eps).any():
        raise ValueError("start and goal coincide: the chord frame is undefined (closed path: use mode='moment')")
    return sim2_matrix(d, _complex(start))


def canonical_frame(P: torch.Tensor, mode: str = "chord") -> tuple[torch.Tensor, torch.Tensor]:
    """Schema-Affine-Factorization of an arc-length path ``P [..., n, 2]``: returns ``(g, W)`` with ``W = g⁻¹·P``.

    ``mode="chord"``: ``g`` maps ``(0, 0) ↦ P(0)`` and ``(1, 0) ↦ P(1)`` (open paths; undefined when they coincide).
    ``mode="moment"``: for closed paths, ``t`` = centroid of the samples, rotation = direction from the centroid to
    ``P(0)``, scale = RMS distance to the centroid; ``W`` is centred with unit RMS radius and starts on the +x axis."""
    _check_finite("path", P)
    if mode == "chord":
        g = chord_frame(P[..., 0, :], P[..., -1, :])
    elif mode == "moment":
        c = P.mean(-2)
        r = _complex(P[..., 0, :] - c)
        rms = (P - c.unsqueeze(-2)).norm(dim=-1).pow(2).mean(-1).sqrt()
        if (r.abs() <= 1e-12 * rms.clamp_min(1e-300)).any():
            raise ValueError("moment frame undefined: the path starts at its own centroid")
        g = sim2_matrix(rms * r / r.abs(), _complex(c))
    else:
        raise ValueError(f"mode must be 'chord' or 'moment', got {mode!r}")
    return g, sim2_act(sim2_inv(g), P)


def factorize(x: torch.Tensor, n: int = 32, mode: str = "chord") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                        torch.Tensor]:
    """Full GAM factorization of time-indexed trajectories ``x [..., T, 2]``: arc-length path → canonical world line.
    Returns ``(W [..., n, 2], ξ [..., 4], u [..., T], L [...])``: schema, affine modulation ``ξ = log g``, timing and
    world arc length."""
    P, L, u = arclength_resample(x, n)
    g, W = canonical_frame(P, mode)
    return W, sim2_log(g), u, L


def compose(W: torch.Tensor, xi: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`factorize`: ``x(t) = exp(ξ)·W(u(t))``. Exact on the Sim(2) part; the path part is the
    ``n``-point polyline, which cuts the original samples' corners (the round trip is not exact)."""
    return sim2_act(sim2_exp(xi), retime(W, u))


# --------------------------------------------------------------------------------------------------- metrics
def frechet(P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """Discrete Fréchet distance between polylines ``P [..., n, d]`` and ``Q [..., m, d]`` (Eiter & Mannila 1994):
    ``C[i, j] = max(|P_i − Q_j|, min(C[i−1, j], C[i−1, j−1], C[i, j−1]))``, ``C[0, 0] = |P_0 − Q_0|``, result
    ``C[n−1, m−1]``. Batched over the leading dims; the recursion runs along anti-diagonals (``n + m − 1`` steps)."""
    _check_finite("P", P)
    _check_finite("Q", Q)
    n, m = P.shape[-2], Q.shape[-2]
    D = (P.unsqueeze(-2) - Q.unsqueeze(-3)).norm(dim=-1)    # |P_i − Q_j| (exact; cdist's matmul form is not)
    C = torch.full((*D.shape[:-2], n + 1, m + 1), math.inf, device=D.device, dtype=D.dtype)
    C[..., 0, 0] = 0.0                                      # padded border; makes C[0, 0] = D[0, 0]
    for k in range(n + m - 1):                              # anti-diagonal i + j = k: entries are independent
        i = torch.arange(max(0, k - m + 1), min(k, n - 1) + 1, device=D.device)
        j = k - i
        prev = torch.minimum(torch.minimum(C[..., i, j + 1], C[..., i, j]), C[..., i + 1, j])
        C[..., i + 1, j + 1] = torch.maximum(D[..., i, j], prev)
    return C[..., n, m]


def path_error(pred: torch.Tensor, target: torch.Tensor, n: int = 32) -> torch.Tensor:
    """Spatial error between two trajectories, timing ignored: both are resampled to ``n`` equal arc-length fractions
    and the mean pointwise distance is returned (``[...]``)."""
    P, _, _ = arclength_resample(pred, n)
    Q, _, _ = arclength_resample(target, n)
    return (P - Q).norm(dim=-1).mean(-1)
