"""Curvilinear Demonstration Selection (CDS): order a fixed demo set along a smooth path in embedding space.

Paper: Chung, Liu, Yu, Yeung, "Many-Shot CoT-ICL: Making In-Context Learning Truly Learn", ICML 2026 (Findings),
arXiv 2605.13511; public code ``TTChungC/Manyshot-CoT-ICL``, ``cot_icl/cds/tsp.py`` (read, not copied).

The steps (all on the raw, L2-normalised embeddings ``E``):

1. cost ``D(i, j) = 0.2 * ||x_i - x_j|| / max ||.|| + 1.0 * curv(i, j)`` where ``curv(i, j) = angle(x_j - x_i,
   x_k - x_j) / pi`` and ``k`` is the demo nearest the midpoint ``(x_i + x_j)/2``, ``k != i, j`` (the "anticipated
   next step"); asymmetric. Ablation "high_curvature": ``curv -> max(curv) - curv``.
2. for starts ``s = 0..n_starts-1``: nearest-neighbour closed tour on ``D``, then first-improvement 2-opt
   (reverse ``tour[i..j]``, ``1 <= i <= n-3``, ``i+2 <= j <= n-1``, accept if the closed tour gets cheaper, keep
   scanning ``j`` with the new tour; sweep until no improvement, at most ``max_iter`` sweeps);
3. cut the closed tour at its most expensive edge (:func:`break_cycle`);
4. score ``1 / (1 + mean turning angle)`` of the path (:func:`curvature_score`); keep the highest-scoring start
   ("cds") or the lowest ("high_curvature").

Everything is batched torch (a batch of tours, or of independent instances, moves in lock-step), so one call orders
thousands of 16-demo sets at once and runs on CUDA unchanged. The published code passes ``strategy=`` to an inner
function whose keyword is ``strat`` (a ``TypeError``); here the strategy is simply honoured.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "break_cycle", "cds_cost_matrix", "cds_order", "curvature_score", "nearest_neighbor_tour", "tour_cost",
    "turning_angles", "two_opt",
]

Tensor = torch.Tensor
STRATEGIES = ("cds", "high_curvature", "random")


def _check_embeddings(E: Tensor, max_dims: int = 3) -> Tensor:
    if not isinstance(E, Tensor):
        E = torch.as_tensor(E)
    if not 2 <= E.ndim <= max_dims:
        raise ValueError(f"embeddings must have shape (n, d) or (batch, n, d), got {tuple(E.shape)}")
    if E.shape[-2] < 3:
        raise ValueError(f"need at least 3 demonstrations to order, got {E.shape[-2]}")
    if not torch.isfinite(E).all():
        raise ValueError("embeddings contain NaN or inf")
    return E if E.is_floating_point() else E.to(torch.float64)


def _angle(dot: Tensor, n1: Tensor, n2: Tensor) -> Tensor:
    """``arccos(dot / (n1 n2))`` clipped to [0, pi]; 0 where a vector has zero length (the repo skips those)."""
    ok = (n1 > 0) & (n2 > 0)
    cos = (dot / torch.where(ok, n1 * n2, torch.ones_like(n1))).clamp(-1.0, 1.0)
    return torch.where(ok, torch.arccos(cos), torch.zeros_like(cos))


def cds_cost_matrix(E: Tensor, euclid_w: float = 0.2, curv_w: float = 1.0, strategy: str = "cds") -> Tensor:
    """The asymmetric CDS cost ``D`` (paper's Principle 2; repo ``create_distance_matrix``), ``(n, n)`` or batched.

    The lengths are computed from the differences of the rows (``torch.cdist`` without the Gram-matrix shortcut),
    as the repo subtracts the rows: two identical demos are exactly 0 apart, so a step between them has no angle
    (curvature 0, as in the repo), where ``||x_i||^2 + ||x_j||^2 - 2 G_ij`` leaves a rounding residue of ~1e-8
    that ``arccos`` would turn into an arbitrary angle. The dot product of the two steps comes from the same
    lengths (polarisation: ``a.b = (|a + b|^2 - |a|^2 - |b|^2) / 2`` with ``a = x_j - x_i``, ``b = x_k - x_j``), so
    it is exactly 0 when either step is. ``k`` comes from the same lengths too: ``||m_ij - x_k||^2 =
    (||x_i - x_k||^2 + ||x_j - x_k||^2) / 2 - ||x_i - x_j||^2 / 4`` (Apollonius), symmetric in ``i`` and ``j``, so a
    copy of ``x_i`` and a copy of ``x_j`` are exactly tied as ``k``. That tie goes to the copy of ``x_j`` (the next
    step then has length 0: curvature 0; a copy of ``x_i`` would make it a reversal, curvature 1), other ties to
    the lowest index; so copies of a demo are interchangeable (relabelling them changes no cost). The public code
    breaks that tie by the rounding of its midpoint. The diagonal is 0 (never used by a tour).
    """
    if strategy not in ("cds", "high_curvature"):
        raise ValueError(f"strategy must be 'cds' or 'high_curvature', got {strategy!r}")
    X = _check_embeddings(E)
    n = X.shape[-2]
    # ||x_i - x_j|| from the differences themselves: exactly 0 for identical rows (and on the diagonal)
    dist = torch.cdist(X, X, compute_mode="donot_use_mm_for_euclid_dist")
    d2 = dist.square()
    # k(i, j): the point nearest the midpoint of x_i and x_j, excluding i and j (squared distance, up to a const)
    to_mid = d2[..., :, None, :] + d2[..., None, :, :]  # [.., i, j, k]
    idx = torch.arange(n, device=X.device)
    excluded = (idx[:, None, None] == idx[None, None, :]) | (idx[None, :, None] == idx[None, None, :])
    to_mid = to_mid.masked_fill(excluded, math.inf)
    tied = to_mid == to_mid.amin(-1, keepdim=True)
    copy_of_j = tied & (d2[..., None, :, :] == 0)  # d2[j, k] == 0: k is a copy of x_j
    k = torch.where(copy_of_j.any(-1, keepdim=True), copy_of_j, tied).to(torch.uint8).argmax(-1)  # first: [.., i, j]
    n_jk = torch.gather(dist, -1, k.transpose(-1, -2)).transpose(-1, -2)  # ||x_k(i,j) - x_j||, from row j
    n_ik = torch.gather(dist, -1, k)  # ||x_k(i,j) - x_i||
    dot = 0.5 * (n_ik.square() - d2 - n_jk.square())  # (x_j - x_i).(x_k - x_j)
    # curv(i, j) = angle(x_j - x_i, x_k - x_j) / pi, 0 on the diagonal and where a step has zero length
    curv = _angle(dot, dist, n_jk) / math.pi
    curv = curv * (1 - torch.eye(n, dtype=curv.dtype, device=curv.device))
    if strategy == "high_curvature":
        curv = curv.amax(dim=(-2, -1), keepdim=True) - curv
    scale = dist.amax(dim=(-2, -1), keepdim=True) + 1e-8
    return euclid_w * dist / scale + curv_w * curv


def _batched(D: Tensor, tours: Tensor) -> tuple[Tensor, Tensor, bool]:
    """Broadcast ``D`` ``(n, n)``/``(B, n, n)`` and ``tours`` ``(n,)``/``(B, n)`` to a common batch."""
    single = tours.ndim == 1
    T = tours[None] if single else tours
    Db = D[None] if D.ndim == 2 else D
    if Db.shape[0] == 1 and T.shape[0] > 1:
        Db = Db.expand(T.shape[0], -1, -1)
    if Db.shape[0] != T.shape[0] or Db.shape[-1] != T.shape[-1] or Db.shape[-2] != Db.shape[-1]:
        raise ValueError(f"cost matrix {tuple(D.shape)} does not match tours {tuple(tours.shape)}")
    return Db, T.long(), single


def _check_cost(D: Tensor) -> None:
    if D.ndim not in (2, 3) or D.shape[-1] != D.shape[-2]:
        raise ValueError(f"cost matrix must be square (n, n) or (batch, n, n), got {tuple(D.shape)}")
    if not torch.isfinite(D).all():
        raise ValueError("cost matrix contains NaN or inf")


def tour_cost(tours: Tensor, D: Tensor, closed: bool = True) -> Tensor:
    """Cost of tours ``(n,)``/``(B, n)`` under ``D``: sum of ``D[t_k, t_{k+1}]`` (plus the closing edge)."""
    Db, T, single = _batched(D, tours)
    nxt = T.roll(-1, dims=-1)
    edges = Db[torch.arange(T.shape[0], device=T.device)[:, None], T, nxt]
    cost = edges.sum(-1) if closed else edges[..., :-1].sum(-1)
    return cost[0] if single else cost


def nearest_neighbor_tour(D: Tensor, start: int | Tensor) -> Tensor:
    """Greedy tour from ``start``: always move to the cheapest unvisited demo (repo ``tsp_nearest_neighbor``).

    ``D`` ``(n, n)`` with an int start gives ``(n,)``; a tensor of starts ``(B,)`` gives ``(B, n)`` (``D`` may be
    batched ``(B, n, n)``). Ties go to the lowest index, as ``min`` over the repo's set does for small ints.
    """
    _check_cost(D)
    n = D.shape[-1]
    starts = torch.as_tensor(start, device=D.device).long()
    single = starts.ndim == 0
    starts = starts.reshape(-1)
    if ((starts < 0) | (starts >= n)).any():
        raise ValueError(f"start must lie in [0, {n - 1}], got {start}")
    Db = D[None].expand(starts.shape[0], -1, -1) if D.ndim == 2 else D
    rows = torch.arange(starts.shape[0], device=D.device)
    visited = torch.zeros(starts.shape[0], n, dtype=torch.bool, device=D.device)
    tour = [starts]
    visited[rows, starts] = True
    for _ in range(n - 1):  # one greedy step for the whole batch at a time
        cost = Db[rows, tour[-1]].masked_fill(visited, math.inf)
        nxt = cost.argmin(-1)
        visited[rows, nxt] = True
        tour.append(nxt)
    out = torch.stack(tour, -1)
    return out[0] if single else out


def _reversal_deltas(Db: Tensor, T: Tensor, i: int) -> Tensor:
    """Change of closed-tour cost when ``T[:, i..j]`` is reversed, for every ``j`` (``(B, n)``; ``inf`` where
    ``j`` is not a legal partner of ``i``)."""
    B, n = T.shape
    rows = torch.arange(B, device=T.device)[:, None]
    fwd = Db[rows, T[:, :-1], T[:, 1:]]  # D[t_k, t_{k+1}], k = 0..n-2
    bwd = Db[rows, T[:, 1:], T[:, :-1]]  # D[t_{k+1}, t_k]
    zero = torch.zeros(B, 1, dtype=Db.dtype, device=Db.device)
    F, Bk = torch.cat([zero, fwd.cumsum(-1)], -1), torch.cat([zero, bwd.cumsum(-1)], -1)  # prefix sums, (B, n)
    j = torch.arange(n, device=T.device)
    after = T[:, (j + 1) % n]  # t_{j+1}, wrapping to t_0
    prev, ti = T[:, i - 1 : i], T[:, i : i + 1]
    old = Db[rows, prev, ti] + (F - F[:, i : i + 1]) + Db[rows, T, after]
    new = Db[rows, prev, T] + (Bk - Bk[:, i : i + 1]) + Db[rows, ti, after]
    delta = new - old
    legal = (j >= i + 2)[None].expand(B, -1)
    return delta.masked_fill(~legal, math.inf)


def _reverse(T: Tensor, rows: Tensor, i: int, j: Tensor) -> Tensor:
    """Reverse ``T[r, i..j[r]]`` for the rows ``rows``."""
    n = T.shape[1]
    pos = torch.arange(n, device=T.device)[None]
    jj = j[:, None]
    inside = (pos >= i) & (pos <= jj)
    src = torch.where(inside, i + jj - pos, pos)
    T = T.clone()
    T[rows] = T[rows].gather(1, src)
    return T


def two_opt(tour: Tensor, D: Tensor, max_iter: int = 500, tol: float = 1e-12) -> Tensor:
    """First-improvement 2-opt on the closed tour, as the repo's ``tsp_2opt`` (batched in lock-step).

    For ``i = 1..n-3`` and ``j = i+2..n-1`` in order: if reversing ``tour[i..j]`` lowers the closed-tour cost (by
    more than ``tol``), take it and keep scanning ``j`` on the new tour. Sweeps repeat until none improves (at most
    ``max_iter``). A row whose sweep found nothing is a 2-opt local optimum and stays unchanged, so running rows
    together gives each the same tour as running it alone. The cost never increases.
    """
    _check_cost(D)
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    Db, T, single = _batched(D, torch.as_tensor(tour, device=D.device))
    n = T.shape[1]
    if not torch.equal(T.sort(-1).values, torch.arange(n, device=T.device).expand_as(T)):
        raise ValueError("tour must be a permutation of range(n)")
    active = torch.ones(T.shape[0], dtype=torch.bool, device=T.device)
    for _ in range(max_iter):
        improved = torch.zeros_like(active)
        for i in range(1, n - 2):
            rows = active.nonzero().squeeze(-1)  # rows still scanning j for this i
            ptr = torch.full_like(rows, i + 2)  # their next j to look at
            j = torch.arange(n, device=T.device)[None]
            while rows.numel():
                # the closed-tour change of every reversal T[i..j], for the scanning rows only
                delta = _reversal_deltas(Db[rows], T[rows], i)
                hit = (delta < -tol) & (j >= ptr[:, None])
                found = hit.any(-1)
                # first improving j on the current tour: take it, then keep scanning from j + 1
                first = torch.where(hit, j, n).amin(-1)[found]
                rows = rows[found]
                T = _reverse(T, rows, i, first)
                ptr = first + 1
                improved[rows] = True
        active = improved
        if not active.any():
            break
    return T[0] if single else T


def break_cycle(tour: Tensor, D: Tensor) -> Tensor:
    """Open the closed tour at its most expensive edge (repo ``break_cycle_to_path``): the path starts right after
    it. The first maximal edge wins ties."""
    _check_cost(D)
    Db, T, single = _batched(D, torch.as_tensor(tour, device=D.device))
    n = T.shape[1]
    edges = Db[torch.arange(T.shape[0], device=T.device)[:, None], T, T.roll(-1, dims=-1)]
    cut = edges.argmax(-1)  # torch returns the first maximal index
    pos = (cut[:, None] + 1 + torch.arange(n, device=T.device)[None]) % n
    out = T.gather(1, pos)
    return out[0] if single else out


def turning_angles(E_path: Tensor) -> Tensor:
    """Turning angles (radians, in [0, pi]) between successive steps ``x_{k+1} - x_k`` of a path ``(..., n, d)``."""
    v = E_path[..., 1:, :] - E_path[..., :-1, :]
    v1, v2 = v[..., :-1, :], v[..., 1:, :]
    return _angle((v1 * v2).sum(-1), v1.norm(dim=-1), v2.norm(dim=-1))


def curvature_score(E_path: Tensor) -> Tensor:
    """Smoothness ``1 / (1 + mean turning angle)`` of the path (repo ``compute_curvature_score``); steps of zero
    length are left out of the mean, as in the repo (score 0 if none is left)."""
    E_path = _check_embeddings(E_path, max_dims=8)
    v = E_path[..., 1:, :] - E_path[..., :-1, :]
    ok = (v[..., :-1, :].norm(dim=-1) > 0) & (v[..., 1:, :].norm(dim=-1) > 0)
    ang = turning_angles(E_path)
    count = ok.sum(-1)
    mean = (ang * ok).sum(-1) / count.clamp_min(1)
    return torch.where(count > 0, 1.0 / (1.0 + mean), torch.zeros_like(mean))


def cds_order(E: Tensor, strategy: str = "cds", n_starts: int = 10, seed: int = 0, max_iter: int = 500,
              ) -> tuple[Tensor, Tensor]:
    """Order the demos ``E`` ``(n, d)`` (or a batch ``(B, n, d)`` of independent sets): returns ``(order, score)``,
    ``order`` a permutation of ``range(n)`` (``(n,)`` or ``(B, n)``), ``score`` its :func:`curvature_score`.

    ``"cds"``: best score over the deterministic starts ``0..n_starts-1``; ``"high_curvature"``: the ablation's
    cost and the worst score; ``"random"``: a uniformly random order drawn with ``seed``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if n_starts < 1:
        raise ValueError(f"n_starts must be >= 1, got {n_starts}")
    X = _check_embeddings(E)
    single = X.ndim == 2
    Xb = X[None] if single else X
    B, n, _ = Xb.shape
    if strategy == "random":
        gen = torch.Generator().manual_seed(seed)
        order = torch.argsort(torch.rand(B, n, generator=gen), -1).to(X.device)
    else:
        D = cds_cost_matrix(Xb, strategy=strategy)
        s = min(n_starts, n)
        Drep = D.repeat_interleave(s, 0)  # (B*s, n, n): every start of every set, in lock-step
        starts = torch.arange(s, device=X.device).repeat(B)
        paths = break_cycle(two_opt(nearest_neighbor_tour(Drep, starts), Drep, max_iter), Drep).view(B, s, n)
        Xrep = Xb[:, None].expand(B, s, n, Xb.shape[-1])
        scores = curvature_score(Xrep.gather(2, paths[..., None].expand(-1, -1, -1, Xb.shape[-1])))
        pick = scores.argmax(-1) if strategy == "cds" else scores.argmin(-1)  # first best start, as the repo
        order = paths[torch.arange(B, device=X.device), pick]
    score = curvature_score(Xb.gather(1, order[..., None].expand(-1, -1, Xb.shape[-1])))
    return (order[0], score[0]) if single else (order, score)
