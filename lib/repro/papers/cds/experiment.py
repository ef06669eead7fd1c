"""The notebook's harness for paper 02: pool statistics of CDS, the brute-force check of 2-opt, and the toy
in-context learner (training, accuracy against shots with the copy rule as its null and on held-out query inputs,
order effects at 16 shots, the spread over demo orders, similarity-based demo selection)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from repro.common import stats
from repro.common.hooks import capture
from repro.common.nn import Transformer, TransformerConfig
from repro.common.train import cosine_schedule, fit

from .method import (
    cds_cost_matrix,
    cds_order,
    curvature_score,
    nearest_neighbor_tour,
    tour_cost,
    turning_angles,
    two_opt,
)
from .problems import ToyFormat, affine_tasks, demo_tokens

__all__ = [
    "BruteForceCheck", "OrderStudy", "PoolStats", "ShotCurve", "SimilarityStudy", "accuracy_vs_shots",
    "bayes_cot_accuracy", "brute_force_check", "brute_force_tour", "copy_rule", "demo_states", "draw_pools",
    "mean_turning_degrees", "order_spread", "order_study", "pca2", "pool_statistics", "shot_curve", "similarity_study",
    "template_switches", "toy_model", "train_toy",
]

Tensor = torch.Tensor


# ---------------------------------------------------------------------------------------------------------------
# Part A: the CDS algorithm on pools of demos


def _gather(E: Tensor, order: Tensor) -> Tensor:
    return E.gather(-2, order[..., None].expand(*order.shape, E.shape[-1]))


@dataclass
class PoolStats:
    """Scores per pool: ``cds``, ``hc`` ``(P,)``, ``random`` ``(P, R)``; the orders of every pool; mean turning
    angles (degrees) of each strategy."""

    cds: np.ndarray
    hc: np.ndarray
    random: np.ndarray
    cds_order: Tensor
    hc_order: Tensor
    random_order: Tensor

    @property
    def cds_beats_all(self) -> np.ndarray:
        """Per pool: 1.0 where the CDS score exceeds every random order's (C1, C2), else 0.0."""
        return (self.cds > self.random.max(1)).astype(float)

    @property
    def hc_below_median(self) -> np.ndarray:
        """Per pool: 1.0 where the high-curvature score is below the random orders' median (C3), else 0.0."""
        return (self.hc < np.median(self.random, 1)).astype(float)

    @property
    def frac_cds_beats_all(self) -> float:
        return float(self.cds_beats_all.mean())

    @property
    def frac_hc_below_median(self) -> float:
        return float(self.hc_below_median.mean())

    @property
    def min_margin(self) -> float:
        return float((self.cds - self.random.max(1)).min())


def draw_pools(E: Tensor, n_pools: int, n: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``n_pools`` pools of ``n`` demos drawn without replacement from the rows of ``E``: the embeddings
    ``(n_pools, n, d)`` and the row indices ``(n_pools, n)``."""
    if n > E.shape[0]:
        raise ValueError(f"a pool of {n} needs at least {n} demos, got {E.shape[0]}")
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(E.shape[0], generator=g)[:n] for _ in range(n_pools)]).to(E.device)
    return E[idx], idx


def pool_statistics(pools: Tensor, n_random: int = 20, n_starts: int = 10, seed: int = 0) -> PoolStats:
    """CDS, high-curvature and ``n_random`` random orders of every pool ``(P, n, d)``, all scored by
    :func:`repro.papers.cds.method.curvature_score`."""
    co, cs = cds_order(pools, "cds", n_starts)
    ho, hs = cds_order(pools, "high_curvature", n_starts)
    P, n, _ = pools.shape
    g = torch.Generator().manual_seed(seed)
    ro = torch.argsort(torch.rand(P, n_random, n, generator=g), -1).to(pools.device)
    rs = curvature_score(_gather(pools[:, None].expand(P, n_random, n, pools.shape[-1]), ro))
    return PoolStats(cs.cpu().numpy(), hs.cpu().numpy(), rs.cpu().numpy(), co, ho, ro)


def mean_turning_degrees(pools: Tensor, orders: Tensor) -> np.ndarray:
    """Mean turning angle (degrees) of each ordered pool (``orders`` ``(P, n)`` or ``(P, R, n)``)."""
    E = pools if orders.ndim == 2 else pools[:, None].expand(*orders.shape, pools.shape[-1])
    return np.degrees(turning_angles(_gather(E, orders)).mean(-1).cpu().numpy())


def template_switches(labels: np.ndarray, orders: Tensor) -> np.ndarray:
    """Number of changes of template along each ordered path (labels ``(P, n)``, orders ``(P, ..., n)``)."""
    o = orders.cpu().numpy()
    lab = np.take_along_axis(labels.reshape(labels.shape[0], *([1] * (o.ndim - 2)), -1), o, -1)
    return (lab[..., 1:] != lab[..., :-1]).sum(-1)


def brute_force_tour(D: Tensor) -> tuple[Tensor, Tensor]:
    """Exact cheapest closed tour(s) by enumeration of all ``(n-1)!`` tours through demo 0 (``n <= 9``); ``D``
    ``(n, n)`` or ``(B, n, n)`` -> (optimal cost, tour)."""
    n = D.shape[-1]
    if n > 9:
        raise ValueError(f"brute force is limited to n <= 9, got {n}")
    perms = torch.tensor([(0, *p) for p in itertools.permutations(range(1, n))], device=D.device)
    Db = D[None] if D.ndim == 2 else D
    cost = Db[:, perms, perms.roll(-1, dims=-1)].sum(-1)  # (B, (n-1)!)
    best = cost.argmin(-1)
    out = cost.gather(1, best[:, None]).squeeze(1), perms[best]
    return (out[0][0], out[1][0]) if D.ndim == 2 else out


@dataclass
class BruteForceCheck:
    """Per instance: optimum, best-of-starts 2-opt cost, worst single start; and whether 2-opt ever got worse."""

    optimum: np.ndarray
    best_start: np.ndarray
    worst_start: np.ndarray
    two_opt_worse: int

    @property
    def best_ratio(self) -> float:
        return float((self.best_start / self.optimum).max())

    @property
    def worst_ratio(self) -> float:
        return float((self.worst_start / self.optimum).max())


def brute_force_check(E: Tensor, strategy: str = "cds") -> BruteForceCheck:
    """2-opt from every start against the exhaustive optimum, for instances ``E`` ``(B, n, d)`` with small ``n``."""
    D = cds_cost_matrix(E, strategy=strategy)
    B, n, _ = E.shape
    opt, _ = brute_force_tour(D)
    Drep = D.repeat_interleave(n, 0)
    nn_t = nearest_neighbor_tour(Drep, torch.arange(n, device=E.device).repeat(B))
    t2 = two_opt(nn_t, Drep)
    c_nn, c2 = tour_cost(nn_t, Drep).view(B, n), tour_cost(t2, Drep).view(B, n)
    worse = int((c2 > c_nn + 1e-12).sum())
    return BruteForceCheck(opt.cpu().numpy(), c2.min(1).values.cpu().numpy(), c2.max(1).values.cpu().numpy(), worse)


def pca2(E: Tensor) -> np.ndarray:
    """2-D PCA coordinates of the rows of ``E`` (for drawing only)."""
    X = E.cpu().numpy()
    X = X - X.mean(0)
    _, _, vt = np.linalg.svd(X, full_matrices=False)
    return X @ vt[:2].T


# ---------------------------------------------------------------------------------------------------------------
# Part B: the toy in-context learner


def toy_model(fmt: ToyFormat, n_demos: int, d_model: int = 64, n_layers: int = 2, n_heads: int = 2,
              seed: int = 0, device: str | torch.device = "cpu") -> Transformer:
    """The small causal transformer of :mod:`repro.common.nn` with rotary positions, sized for ``n_demos`` demos."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=fmt.vocab, max_len=fmt.width * n_demos, d_model=d_model, n_layers=n_layers,
                            n_heads=n_heads, causal=True, positions="rotary")
    return Transformer(cfg).to(device)


def _loss_mask(fmt: ToyFormat, n_demos: int, device: str | torch.device) -> Tensor:
    """Positions (of the shifted targets) that are ``t`` or ``y`` of a demo (CoT), or ``y`` (direct)."""
    slot = torch.arange(fmt.width * n_demos, device=device) % fmt.width
    keep = (slot == 1) | (slot == 2) if fmt.cot else slot == 1
    return keep[1:]


def train_toy(model: Transformer, fmt: ToyFormat, n_demos: int = 33, steps: int = 1500, batch: int = 16,
              lr: float = 3e-3, warmup: int = 50, seed: int = 0) -> list[float]:
    """Meta-train on random tasks: next-token loss on the ``t`` and ``y`` of every demo, so one sequence of
    ``n_demos`` demos trains every shot count from 0 to ``n_demos - 1`` (AdamW, warm-up + cosine, clip 1)."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    mask = _loss_mask(fmt, n_demos, device)

    def step_loss(_: int) -> Tensor:
        a, b, x = affine_tasks(batch, n_demos, fmt.p, gen, device)
        tok = demo_tokens(fmt, a, b, x)
        logits = model(tok[:, :-1])
        return torch.nn.functional.cross_entropy(logits[:, mask].flatten(0, 1), tok[:, 1:][:, mask].flatten())

    return fit(model, step_loss, steps, lr=lr, optimizer="adamw", betas=(0.9, 0.98), weight_decay=0.01,
               schedule=lambda i: cosine_schedule(i, steps, warmup), clip=1.0)


@torch.no_grad()
def answer(model: Transformer, fmt: ToyFormat, context: Tensor, xq: Tensor) -> Tensor:
    """Greedy answer to the query ``xq`` ``(B,)`` after the demo tokens ``context`` ``(B, L)``: CoT generates
    ``t_hat`` first, then ``y_hat`` (one forward pass over the sequence, then one token on its key/value cache)."""
    seq = torch.cat([context, xq[:, None]], 1)
    if not fmt.cot:
        return model(seq)[:, -1, : fmt.p].argmax(-1)
    logits, cache = model(seq, return_cache=True)
    t_hat = logits[:, -1, : fmt.p].argmax(-1)
    return model(t_hat[:, None], cache=cache)[:, -1, : fmt.p].argmax(-1)


def copy_rule(x: Tensor, xq: Tensor, p: int) -> Tensor:
    """Expected accuracy of the copy rule on each task: answer with the ``y`` of a demo whose input equals the
    query's, else guess uniformly. The demos of a task agree, so it is 1 where ``xq`` is among the demo inputs
    ``x`` ``(B, k)`` and ``1/p`` elsewhere (the null that "learning from the demos" has to beat)."""
    seen = (x == xq[:, None]).any(-1)
    return torch.full(seen.shape, 1.0 / p, dtype=torch.float64, device=x.device).masked_fill(seen, 1.0)


@dataclass
class ShotCurve:
    """Per-task results at each shot count ``shots[i]``: the model's correctness ``correct`` ``(K, T)``, the copy
    rule's expected accuracy ``copy`` ``(K, T)`` and the ideal (Bayes) learner's correctness ``ideal`` ``(K, T)``
    on the same tasks."""

    shots: list[int]
    correct: np.ndarray
    copy: np.ndarray
    ideal: np.ndarray

    @property
    def accuracy(self) -> np.ndarray:
        return self.correct.mean(1)

    def at(self, k: int) -> int:
        """Row of shot count ``k``."""
        return self.shots.index(k)

    def gain_statistic(self, high: tuple[int, ...] = (16, 24, 32), low: tuple[int, ...] = (1, 2),
                       ) -> Callable[..., float]:
        """The statistic of C6 on the rows of ``correct`` (or ``copy``) passed as separate arrays: mean accuracy
        over the shot counts ``high`` minus the mean over ``low`` (for a bootstrap over tasks)."""
        hi, lo = [self.at(k) for k in high], [self.at(k) for k in low]

        def gain(*rows: np.ndarray) -> float:
            return float(np.mean([rows[i].mean() for i in hi]) - np.mean([rows[i].mean() for i in lo]))

        return gain


def _heldout_inputs(n_tasks: int, k: int, p: int, gen: torch.Generator, device: str | torch.device,
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """Tasks whose query input is not among the ``k`` demo inputs: ``a, b`` and the query as :func:`affine_tasks`,
    each demo input uniform over the other ``p - 1`` residues (exactly the i.i.d. tasks conditioned on an unseen
    query); the query is the last column of ``x``."""
    a, b, xq = affine_tasks(n_tasks, 1, p, gen, device)
    shift = torch.randint(1, p, (n_tasks, k), generator=gen).to(device)
    return a, b, torch.cat([(xq + shift) % p, xq], 1)


@torch.no_grad()
def shot_curve(model: Transformer, fmt: ToyFormat, shots: list[int], n_tasks: int = 1024, seed: int = 1,
               heldout: bool = False) -> ShotCurve:
    """Greedy answers after ``k`` random demos for each ``k`` in ``shots`` (fresh tasks per ``k``), with the copy
    rule and the ideal learner on the same tasks. ``heldout=True``: only queries whose input is not among the demos
    (where copying can only guess, so accuracy above ``1/p`` is inference of ``a`` and ``b``)."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    correct, copy, ideal = [], [], []
    for k in shots:
        if heldout:
            a, b, x = _heldout_inputs(n_tasks, k, fmt.p, gen, device)
        else:
            a, b, x = affine_tasks(n_tasks, k + 1, fmt.p, gen, device)
        xs, xq = x[:, :k], x[:, k]
        y = (a[:, 0] * xq + b[:, 0]) % fmt.p
        correct.append((answer(model, fmt, demo_tokens(fmt, a, b, xs), xq) == y).cpu().numpy().astype(float))
        copy.append(copy_rule(xs, xq, fmt.p).cpu().numpy())
        ideal.append((_bayes_answers(fmt.p, a.cpu(), b.cpu(), x.cpu()) == y.cpu()).numpy().astype(float))
    return ShotCurve(list(shots), np.stack(correct), np.stack(copy), np.stack(ideal))


@torch.no_grad()
def accuracy_vs_shots(model: Transformer, fmt: ToyFormat, shots: list[int], n_tasks: int = 1024, seed: int = 1,
                      ) -> np.ndarray:
    """Accuracy of greedy answers after ``k`` random demos, for each ``k`` in ``shots`` (fresh tasks per ``k``)."""
    return shot_curve(model, fmt, shots, n_tasks, seed).accuracy


@torch.no_grad()
def order_spread(model: Transformer, fmt: ToyFormat, shots: list[int], n_orders: int = 5, n_tasks: int = 1024,
                 seed: int = 3) -> np.ndarray:
    """The paper's Fig. 6 on the toy: for each ``k``, the same ``n_tasks`` tasks with their ``k`` demos in
    ``n_orders`` random orders; per-task correctness ``(K, n_orders, n_tasks)``."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in shots:
        a, b, x = affine_tasks(n_tasks, k + 1, fmt.p, gen, device)
        xs, xq = x[:, :k], x[:, k]
        y = (a[:, 0] * xq + b[:, 0]) % fmt.p
        per = []
        for _ in range(n_orders):
            o = torch.argsort(torch.rand(n_tasks, k, generator=gen), -1).to(device)
            per.append((answer(model, fmt, demo_tokens(fmt, a, b, xs.gather(1, o)), xq) == y).cpu().numpy())
        out.append(np.stack(per).astype(float))
    return np.stack(out)


@dataclass
class SimilarityStudy:
    """The paper's Fig. 5 on the toy: per-task correctness with ``k`` demos picked from a pool by their similarity
    to the query (``similar``, ``dissimilar``) or at random (``random``); ``same_x``: mean share of the picked demos
    whose input equals the query's (what a copy rule could use)."""

    correct: dict[str, np.ndarray]
    same_x: dict[str, float]

    @property
    def accuracy(self) -> dict[str, float]:
        return {m: float(c.mean()) for m, c in self.correct.items()}


@torch.no_grad()
def similarity_study(model: Transformer, fmt: ToyFormat, k: int = 16, pool: int = 64, n_tasks: int = 1024,
                     seed: int = 4) -> SimilarityStudy:
    """``k`` of ``pool`` demos of each task: the first ``k`` (random), or the ``k`` most or least similar to the
    query by the cosine of the model's own states (a demo's final-layer states mean-pooled, read alone, as for CDS;
    the query's input token read alone); the picked demos keep their pool order."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    a, b, x = affine_tasks(n_tasks, pool + 1, fmt.p, gen, device)
    xs, xq = x[:, :pool], x[:, pool]
    y = (a[:, 0] * xq + b[:, 0]) % fmt.p
    H = torch.nn.functional.normalize(demo_states(model, fmt, a, b, xs), dim=-1)
    q = torch.nn.functional.normalize(_final_states(model, xq[:, None])[:, 0].to(torch.float64), dim=-1)
    sim = (H * q[:, None]).sum(-1)  # (T, pool)
    picks = {"random": torch.arange(k, device=device).expand(n_tasks, k),
             "similar": sim.topk(k, -1).indices.sort(-1).values,
             "dissimilar": (-sim).topk(k, -1).indices.sort(-1).values}
    correct, same = {}, {}
    for name, idx in picks.items():
        sel = xs.gather(1, idx)
        correct[name] = (answer(model, fmt, demo_tokens(fmt, a, b, sel), xq) == y).cpu().numpy().astype(float)
        same[name] = float((sel == xq[:, None]).double().mean())
    return SimilarityStudy(correct, same)


@torch.no_grad()
def _final_states(model: Transformer, tok: Tensor) -> Tensor:
    """Final-layer (post-LayerNorm) states of ``tok`` ``(B, L)``: ``(B, L, d_model)``."""
    with capture([model.ln_f]) as store:
        model(tok)
    return store[0]


@torch.no_grad()
def demo_states(model: Transformer, fmt: ToyFormat, a: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """The model's own embedding of each demo: its final-layer (post-LayerNorm) states, mean-pooled over the demo's
    tokens, each demo read alone: ``(n_tasks, n_demos, d_model)``."""
    T, k = x.shape
    tok = demo_tokens(fmt, a, b, x).view(T * k, fmt.width)
    return _final_states(model, tok).mean(1).view(T, k, -1).to(torch.float64)


@dataclass
class OrderStudy:
    """Accuracy per ordering at ``k`` shots (same demo sets and queries); paired differences (and their standard
    errors) to random order, and ``"cds-high_curvature"``: CDS against the ablation; ``correct``: the per-task
    correctness of each ordering (for a paired bootstrap)."""

    accuracy: dict[str, float]
    diff: dict[str, float]
    se: dict[str, float]
    correct: dict[str, np.ndarray]


@torch.no_grad()
def order_study(model: Transformer, fmt: ToyFormat, k: int = 16, n_tasks: int = 1024, seed: int = 2,
                n_starts: int = 10) -> OrderStudy:
    """Random vs sorted-by-x vs CDS (on the model's own demo states) vs high-curvature order of the same ``k``
    demos; CDS and the ablation run batched over all tasks."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    a, b, x = affine_tasks(n_tasks, k + 1, fmt.p, gen, device)
    xs, xq = x[:, :k], x[:, k]
    y = (a[:, 0] * xq + b[:, 0]) % fmt.p
    H = demo_states(model, fmt, a, b, xs)
    orders = {
        "random": torch.arange(k, device=device).expand(n_tasks, k),  # the demos are i.i.d., so as drawn = random
        "sorted": torch.sort(xs, dim=-1, stable=True).indices,
        "cds": cds_order(H, "cds", n_starts)[0],
        "high_curvature": cds_order(H, "high_curvature", n_starts)[0],
    }
    correct = {}
    for name, o in orders.items():
        hit = answer(model, fmt, demo_tokens(fmt, a, b, xs.gather(1, o)), xq) == y
        correct[name] = hit.cpu().numpy().astype(float)
    acc = {m: float(c.mean()) for m, c in correct.items()}
    diff = {m: float((c - correct["random"]).mean()) for m, c in correct.items() if m != "random"}
    se = {m: stats.se(c - correct["random"]) for m, c in correct.items() if m != "random"}
    paired = correct["cds"] - correct["high_curvature"]  # the paper's Table 4 comparison
    diff["cds-high_curvature"] = float(paired.mean())
    se["cds-high_curvature"] = stats.se(paired)
    return OrderStudy(acc, diff, se, correct)


def _bayes_answers(p: int, a: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """The ideal CoT learner's answers: exact posterior over ``(a, b)`` given the demos ``(x, t, y)`` of
    ``x[:, :-1]``, answer = the posterior-most-likely ``y`` for the query ``x[:, -1]`` (ties to the lowest)."""
    k = x.shape[1] - 1
    A = torch.arange(1, p).repeat_interleave(p)  # all hypotheses (a, b)
    Bh = torch.arange(p).repeat(p - 1)
    t, yv = (a * x) % p, (a * x + b) % p
    ok = (((A[None, None] * x[:, :k, None]) % p == t[:, :k, None])
          & (((A[None, None] * x[:, :k, None] + Bh[None, None]) % p) == yv[:, :k, None])).all(1)
    pred = (A[None] * x[:, k:] + Bh[None]) % p  # (T, H)
    votes = torch.zeros(x.shape[0], p, dtype=torch.float32).scatter_add_(1, pred, ok.float())
    return votes.argmax(-1)


def bayes_cot_accuracy(p: int, shots: list[int], n_tasks: int = 4096, seed: int = 0) -> np.ndarray:
    """Accuracy of the ideal learner with CoT demos: exact posterior over ``(a, b)`` given ``k`` demos ``(x, t,
    y)``, answer = the posterior-most-likely ``y`` (reference line for the toy curves)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in shots:
        a, b, x = affine_tasks(n_tasks, k + 1, p, gen)
        yv = (a[:, 0] * x[:, k] + b[:, 0]) % p
        out.append(float((_bayes_answers(p, a, b, x) == yv).float().mean()))
    return np.array(out)
