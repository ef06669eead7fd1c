"""The notebook's harness for paper 06: train the toy transformer on facts + chain-of-thought sums + in-context
overrides, apply 1..50 sequential edits with ROME / MEMIT / AlphaEdit / retrieval, and measure reliability,
locality, greedy reasoning accuracy, in-context override accuracy, held-out loss and the relative change rates R_k.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr

from repro.common.nn import Transformer, TransformerConfig
from repro.common.numerics import loglog_slope
from repro.common.train import cosine_schedule, fit

from . import problems as P
from .method import (
    RetrievalEditor,
    VStarProblem,
    alphaedit_projector,
    alphaedit_update,
    key_covariance,
    mean_key,
    memit_update,
    optimize_v_stars,
    relative_change_rates,
    rome_update,
)

Tensor = torch.Tensor
EDITORS = ("rome", "memit", "alphaedit", "retrieval")


# ---------------------------------------------------------------------------------------------------------------
# training and evaluation


def train_toy(world: P.World, steps: int, rng: np.random.Generator, *, d_model: int = 96, n_layers: int = 3,
              n_heads: int = 4, d_ff: int = 384, batch: int = 64, lr: float = 3e-3, warmup: int = 100,
              mix: tuple[float, float, float] = (0.3, 0.45, 0.25), device: torch.device | str = "cpu"
              ) -> tuple[Transformer, list[float]]:
    """The causal toy transformer trained with ``repro.common.train.fit`` (AdamW, cosine, clip 1)."""
    torch.manual_seed(int(rng.integers(2**31)))
    cfg = TransformerConfig(world.vocab_size, P.MAX_LEN, d_model, n_layers, n_heads, d_ff, causal=True)
    model = Transformer(cfg).to(device)

    def step_loss(i: int) -> Tensor:
        tok, mask = P.training_batch(world, batch, mix, rng, device)
        width = int((tok != world.sp("PAD")).sum(1).max())  # right padding: the causal model never reads it
        tok, mask = tok[:, :width], mask[:, :width]
        logits = model(tok[:, :-1])
        tgt = tok[:, 1:]
        return torch.nn.functional.cross_entropy(logits[mask[:, :-1]], tgt[mask[:, :-1]])

    losses = fit(model, step_loss, steps, lr=lr, optimizer="adamw", betas=(0.9, 0.98),
                 schedule=lambda i: cosine_schedule(i, steps, warmup), clip=1.0)
    return model, losses


@dataclass
class Suite:
    """Fixed evaluation prompts (never-edited subjects for locality and contexts)."""

    world: P.World
    edits: np.ndarray  # (n_edits, 3): subject, relation, new object
    loc: np.ndarray  # (m, 2): never-edited (subject, relation)
    reasoning: Tensor  # full sequences
    ctx_rel: Tensor
    ctx_irr: Tensor
    heldout: tuple[Tensor, Tensor]
    probe: Tensor  # fixed mixed batch for the hidden states (R_k)
    probe_mask: Tensor


def make_suite(world: P.World, n_edits: int, rng: np.random.Generator, n_reasoning: int = 500, n_ctx: int = 200,
               device: torch.device | str = "cpu") -> Suite:
    """Counterfactual edits (distinct subjects, a random relation, a new object ≠ the stored one) and the fixed
    evaluation sets."""
    if not 1 <= n_edits < world.n_subjects:
        raise ValueError(f"n_edits must lie in [1, {world.n_subjects - 1}], got {n_edits}")
    subj = rng.permutation(world.n_subjects)
    s, rest = subj[:n_edits], np.sort(subj[n_edits:])
    r = rng.integers(0, 2, n_edits)
    o = (world.facts[s, r] + rng.integers(1, world.n_objects, n_edits)) % world.n_objects
    kept = P.World(len(rest), world.facts[rest], tuple(world.names[i] for i in rest))

    def ctx(relevant: bool) -> Tensor:  # contexts about never-edited subjects, mapped back to world ids
        rows = P.random_contexts(kept, n_ctx, rng, relevant=relevant)
        rows[:, [2, 7]] = world.subj(rest[rows[:, [2, 7]] - kept.subj(0)])
        rows[:, [4, 10]] += world.obj(0) - kept.obj(0)
        return torch.as_tensor(rows, device=device)

    reas, _ = P.reasoning_seqs(world, rng.integers(0, 10, (n_reasoning, 4)))
    ho = P.training_batch(world, 256, (0.3, 0.45, 0.25), rng, device)
    probe, _ = P.training_batch(world, 256, (0.3, 0.45, 0.25), rng, device)
    loc = np.stack(np.meshgrid(rest, [0, 1], indexing="ij"), -1).reshape(-1, 2)
    return Suite(world, np.stack([s, r, o], 1), loc, torch.as_tensor(reas, device=device), ctx(True), ctx(False),
                 ho, probe, probe != world.sp("PAD"))


def _answers(model: torch.nn.Module, seqs: Tensor, start: int) -> float:
    """Exact-match accuracy of greedy decoding of ``seqs[:, start:]`` (answer and EOS) from ``seqs[:, :start]``."""
    out = P.greedy(model, seqs[:, :start], seqs.shape[1] - start)
    return float((out == seqs[:, start:]).all(1).float().mean())


def _fact_tensor(world: P.World, s: np.ndarray, r: np.ndarray, o: np.ndarray, device) -> Tensor:
    return torch.as_tensor(P.fact_seqs(world, s, r, o)[0], device=device)


@torch.no_grad()
def evaluate(model: torch.nn.Module, suite: Suite, n_done: int) -> dict[str, float]:
    """Reliability (first ``n_done`` edits), locality, reasoning, in-context overrides, held-out loss."""
    w, dev = suite.world, suite.reasoning.device
    e = suite.edits[:n_done]
    out = {"rel": _answers(model, _fact_tensor(w, e[:, 0], e[:, 1], e[:, 2], dev), 5) if n_done else float("nan"),
           "loc": _answers(model, _fact_tensor(w, suite.loc[:, 0], suite.loc[:, 1],
                                               w.facts[suite.loc[:, 0], suite.loc[:, 1]], dev), 5),
           "reasoning": _answers(model, suite.reasoning, 9), "ctx_rel": _answers(model, suite.ctx_rel, 10),
           "ctx_irr": _answers(model, suite.ctx_irr, 10)}
    tok, mask = suite.heldout
    logits = model(tok[:, :-1])
    out["loss"] = float(torch.nn.functional.cross_entropy(logits[mask[:, :-1]], tok[:, 1:][mask[:, :-1]]))
    return out


@torch.no_grad()
def block_outputs(model: Transformer, tokens: Tensor, mask: Tensor) -> list[Tensor]:
    """Residual stream after each block at the non-pad positions, one ``(n, d)`` matrix per block."""
    got: list[Tensor] = []
    hooks = [b.register_forward_hook(lambda m, i, o: got.append(o[0])) for b in model.blocks]
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return [g[mask] for g in got]


@torch.no_grad()
def mlp_keys(model: Transformer, layer: int, tokens: Tensor, mask: Tensor) -> Tensor:
    """Inputs of block ``layer``'s MLP output matrix (the keys ``k``) at the non-pad positions."""
    got: list[Tensor] = []
    h = model.blocks[layer].mlp[2].register_forward_hook(lambda m, i, o: got.append(i[0]))
    try:
        model(tokens)
    finally:
        h.remove()
    return got[0][mask]


def key_statistics(model: Transformer, world: P.World, layer: int, rng: np.random.Generator, *,
                   with_reasoning: bool, batches: int = 20, batch: int = 128) -> Tensor:
    """Keys of block ``layer`` over ``batches × batch`` sequences of the chosen corpus (float64), rows = keys."""
    dev = next(model.parameters()).device
    ks = [mlp_keys(model, layer, *P.covariance_batch(world, batch, rng, with_reasoning, dev)) for _ in range(batches)]
    return torch.cat(ks).double()


# ---------------------------------------------------------------------------------------------------------------
# one edit's key and target


def edit_prompts(world: P.World, s: int, r: int, rng: np.random.Generator, n_ctx: int = 4, device="cpu"
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The plain prompt and ``n_ctx`` irrelevant-context prompts ending in ``Q s r ->`` (padded to one length by
    placing the plain prompt's tokens after PAD-free context), with subject and answer positions."""
    plain = P.fact_seqs(world, np.array([s]), np.array([r]), np.array([0]))[0][:, :5]
    others = (s + rng.integers(1, world.n_subjects, n_ctx)) % world.n_subjects
    cr = rng.integers(0, 2, n_ctx)
    ctx = P.context_seqs(world, others, cr, world.facts[others, cr], np.full(n_ctx, s), np.full(n_ctx, r),
                         np.zeros(n_ctx, dtype=int))[0][:, :10]
    rows = [torch.as_tensor(plain, device=device), torch.as_tensor(ctx, device=device)]
    return rows[0], rows[1], torch.tensor([2], device=device), torch.full((n_ctx,), 7, device=device)


def edit_target(model: Transformer, world: P.World, layer: int, s: int, r: int, o: int, rng: np.random.Generator,
                v_steps: int = 50, v_lr: float = 0.5, key: str = "plain") -> tuple[Tensor, Tensor]:
    """(k*, v*) of one counterfactual ``(s, r) -> o`` at block ``layer``'s MLP output matrix (ROME §3.1).

    v* is optimised on the plain prompt and 4 irrelevant-context prompts; k* is the subject's key in the plain
    prompt (``key="plain"``, the evaluated form) or the mean over all five (``key="mean"``, ROME's choice; in this
    toy the subject's key depends strongly on its position, so the mean misses the plain prompt's key)."""
    K, V = edit_targets(model, world, layer, np.array([[s, r, o]]), rng, v_steps=v_steps, v_lr=v_lr, key=key)
    return K[0], V[0]


def edit_targets(model: Transformer, world: P.World, layer: int, edits: np.ndarray, rng: np.random.Generator,
                 v_steps: int = 50, v_lr: float = 0.5, key: str = "plain") -> tuple[Tensor, Tensor]:
    """Keys ``K`` and targets ``V`` (rows) of the edits ``(s, r, o)`` of :func:`edit_target`, every v* computed
    from the current model in one batched optimisation (:func:`~.method.optimize_v_stars`)."""
    if key not in ("plain", "mean"):
        raise ValueError(f"key must be 'plain' or 'mean', got {key!r}")
    dev = next(model.parameters()).device
    mod = model.blocks[layer].mlp[2]
    four = torch.tensor([4], device=dev)
    keys, problems = [], []
    for s, r, o in np.asarray(edits, dtype=int).reshape(-1, 3):
        plain, ctx, p_pos, c_pos = edit_prompts(world, s, r, rng, device=dev)
        k = mean_key(model, mod, plain, p_pos)
        keys.append((k + 4 * mean_key(model, mod, ctx, c_pos)) / 5 if key == "mean" else k)
        kl = torch.as_tensor(P.fact_seqs(world, np.array([s]), np.array([1 - r]), np.array([0]))[0][:, :5],
                             device=dev)
        problems.append(VStarProblem([(plain, p_pos, four), (ctx, c_pos, torch.full_like(c_pos, 9))],
                                     int(world.obj(o)), [(kl, p_pos, four)]))
    delta = optimize_v_stars(model, mod, problems, steps=v_steps, lr=v_lr)
    K = torch.stack(keys)
    with torch.no_grad():
        return K, K @ mod.weight.T + delta


# ---------------------------------------------------------------------------------------------------------------
# sequential editing


@dataclass
class Trace:
    """Metrics after ``T`` edits (``T = 0`` is the unedited model) and R_k at the edited block's output."""

    editor: str
    Ts: list[int]
    metrics: list[dict[str, float]]
    sigma: list[np.ndarray] = field(default_factory=list)  # per T >= 1, per block: σ_k
    R: list[list[np.ndarray]] = field(default_factory=list)  # per T >= 1, per block: R_k
    single: float = float("nan")  # mean reliability of the edits each applied alone (the paper's single setting)

    def series(self, key: str) -> np.ndarray:
        return np.array([m[key] for m in self.metrics])


def run_parametric(model: Transformer, suite: Suite, editor: str, layer: int, checkpoints: list[int],
                   rng: np.random.Generator, *, C: Tensor | None = None, K0: Tensor | None = None,
                   alpha_tol: float = 1e-3, memit_weight: float = 1.0, v_steps: int = 50) -> Trace:
    """Apply the suite's edits in order with ROME (one at a time), MEMIT or AlphaEdit (the edits between two
    checkpoints as one batch), evaluating at each checkpoint. Works on a copy of ``model``."""
    if editor not in ("rome", "memit", "alphaedit"):
        raise ValueError(f"unknown parametric editor {editor!r}")
    m = copy.deepcopy(model).eval()
    mod = m.blocks[layer].mlp[2]
    H0 = [h.double() for h in block_outputs(m, suite.probe, suite.probe_mask)]
    if editor in ("rome", "memit") and C is None:
        raise ValueError(f"{editor} needs the key covariance C")
    C_inv = torch.linalg.pinv(C).to(mod.weight.dtype) if editor == "rome" else None
    Pj = alphaedit_projector(K0, alpha_tol).to(mod.weight.dtype) if editor == "alphaedit" else None
    trace = Trace(editor, [0], [evaluate(m, suite, 0)])
    done, K_prev = 0, None
    for T in checkpoints:
        while done < T:
            stop = done + 1 if editor == "rome" else T
            K, V = edit_targets(m, suite.world, layer, suite.edits[done:stop], rng, v_steps=v_steps)
            mod.weight.data += _update(editor, mod.weight.data, K, V, C=C, C_inv=C_inv, proj=Pj, K_prev=K_prev,
                                       memit_weight=memit_weight)
            if editor == "alphaedit":
                K_prev = K if K_prev is None else torch.cat([K_prev, K])
            done = stop
        trace.Ts.append(T)
        trace.metrics.append(evaluate(m, suite, T))
        H = block_outputs(m, suite.probe, suite.probe_mask)
        sr = [relative_change_rates(h0, h.double() - h0) for h0, h in zip(H0, H, strict=True)]
        trace.sigma.append([s.cpu().numpy() for s, _ in sr])
        trace.R.append([r.cpu().numpy() for _, r in sr])
    return trace


def _update(editor: str, W: Tensor, K: Tensor, V: Tensor, *, C: Tensor | None, C_inv: Tensor | None,
            proj: Tensor | None, K_prev: Tensor | None, memit_weight: float) -> Tensor:
    """ΔW of one editor for the keys ``K`` and targets ``V`` (rows)."""
    if editor == "rome":
        return rome_update(W, K[0], V[0], C_inv)
    if editor == "memit":
        return memit_update(W.double(), K.double(), V.double(), memit_weight * C.double()).to(W.dtype)
    return alphaedit_update(W, K, V, proj, K_prev)


def single_edit_reliability(model: Transformer, suite: Suite, embed_fn, layer: int, rng: np.random.Generator, *,
                            C: Tensor, K0: Tensor, threshold: float, alpha_tol: float = 1e-3,
                            memit_weight: float = 1.0, v_steps: int = 50) -> dict[str, float]:
    """The paper's *single* setting: each of the suite's edits applied alone to the unedited model, reliability
    averaged over the edits, per editor (ROME / MEMIT / AlphaEdit with the statistics of ``run_parametric``;
    retrieval with that one fact in its store). All v* come from the unedited model in one batch."""
    w = suite.world
    m = copy.deepcopy(model).eval()
    mod = m.blocks[layer].mlp[2]
    K, V = edit_targets(m, w, layer, suite.edits, rng, v_steps=v_steps)
    W0 = mod.weight.data.clone()
    stats = dict(C=C, C_inv=torch.linalg.pinv(C).to(W0.dtype), proj=alphaedit_projector(K0, alpha_tol).to(W0.dtype),
                 K_prev=None, memit_weight=memit_weight)
    facts = [_fact_tensor(w, *(np.array([x]) for x in e), W0.device) for e in suite.edits]
    out: dict[str, float] = {}
    try:
        for editor in ("rome", "memit", "alphaedit"):
            hits = []
            for i, seqs in enumerate(facts):
                mod.weight.data = W0 + _update(editor, W0, K[i:i + 1], V[i:i + 1], **stats)
                hits.append(_answers(m, seqs, 5))
            out[editor] = float(np.mean(hits))
    finally:
        mod.weight.data = W0
    hits = []
    for (s, r, o), seqs in zip(suite.edits, facts, strict=True):
        text = P.render(w, [w.subj(s), w.rel(r), w.obj(o)])
        store = RetrievalEditor(embed_fn, threshold)
        store.add(text)
        hits.append(_gated(model, w, store, {text: (int(s), int(r), int(o))}, seqs, 5)[0])
    out["retrieval"] = float(np.mean(hits))
    return out


@torch.no_grad()
def run_retrieval(model: Transformer, suite: Suite, editor: RetrievalEditor, checkpoints: list[int]) -> Trace:
    """The SCR analogue on the unedited weights: store each edit as text; every query (facts, reasoning) goes
    through ``editor``'s gate and, when a stored fact is confirmed, is asked after ``CTX s r o' ;``."""
    w, dev = suite.world, suite.reasoning.device
    index: dict[str, tuple[int, int, int]] = {}
    trace = Trace("retrieval", [0], [evaluate(model, suite, 0)])
    done = 0
    for T in checkpoints:
        for s, r, o in suite.edits[done:T]:
            text = P.render(w, [w.subj(s), w.rel(r), w.obj(o)])
            index[text] = (int(s), int(r), int(o))
            editor.add(text)
        done = T
        e = suite.edits[:T]
        met: dict[str, float] = {}
        for name, seqs, start in (
                ("rel", _fact_tensor(w, e[:, 0], e[:, 1], e[:, 2], dev), 5),
                ("loc", _fact_tensor(w, suite.loc[:, 0], suite.loc[:, 1], w.facts[suite.loc[:, 0], suite.loc[:, 1]],
                                     dev), 5),
                ("reasoning", suite.reasoning, 9)):
            met[name], met[name + "_gated"] = _gated(model, w, editor, index, seqs, start)
        trace.Ts.append(T)
        trace.metrics.append(met)
    return trace


def _gated(model: torch.nn.Module, world: P.World, editor: RetrievalEditor, index: dict, seqs: Tensor, start: int
           ) -> tuple[float, float]:
    """Accuracy when each prompt ``seqs[:, :start]`` is first passed through the retrieval gate, and the share of
    prompts the gate let a stored fact through for."""
    prompts = seqs[:, :start]
    found = editor.retrieve([P.render(world, row.tolist()) for row in prompts])
    ok = torch.zeros(len(found), dtype=torch.bool, device=seqs.device)
    hit = torch.tensor([f is not None for f in found], device=seqs.device)
    if (~hit).any():
        out = P.greedy(model, prompts[~hit], seqs.shape[1] - start)
        ok[~hit] = (out == seqs[~hit, start:]).all(1)
    if hit.any():
        ctx = torch.tensor([[world.sp("BOS"), world.sp("CTX"), world.subj(index[f][0]), world.rel(index[f][1]),
                             world.obj(index[f][2]), world.sp(";")] for f in found if f is not None],
                           device=seqs.device)
        full = torch.cat([ctx, prompts[hit][:, 1:]], 1)  # BOS CTX s r o ; <prompt without BOS>
        out = P.greedy(model, full, seqs.shape[1] - start)
        ok[hit] = (out == seqs[hit, start:]).all(1)
    return float(ok.float().mean()), float(hit.float().mean())


# ---------------------------------------------------------------------------------------------------------------
# R_k summaries


def rk_summary(sigma: np.ndarray, R: np.ndarray, top: float = 0.1) -> dict[str, float]:
    """Spearman(R_k, σ_k), the share of the top-``top`` R_k directions in the lowest-σ decile (chance: 0.1),
    and max / median R_k."""
    n = len(sigma)
    k_top, k_low = max(1, int(round(top * n))), max(1, int(round(0.1 * n)))
    top_idx = np.argsort(-R)[:k_top]
    low = set(np.argsort(sigma)[:k_low].tolist())
    return {"spearman": float(spearmanr(R, sigma)[0]), "top_in_low": float(np.mean([i in low for i in top_idx])),
            "chance": k_low / n, "max": float(R.max()), "median": float(np.median(R))}


def compare_editors(model: Transformer, suite: Suite, embed_fn, *, layer: int, checkpoints: list[int],
                    short_checkpoints: list[int], threshold: float, alpha_tol: float, memit_weight: float,
                    v_steps: int, cov_batches: int, rng: np.random.Generator) -> dict[str, Trace]:
    """Every editor of the notebook on one trained model: ROME with C from facts and contexts ("rome"), the same
    with C from the full training mix ("rome_call", the control), MEMIT and AlphaEdit (their statistics from
    facts and contexts) and retrieval; each trace's ``single`` is the editor's single-setting reliability
    (:func:`single_edit_reliability`; not run for the control)."""
    w = suite.world
    keys = {flag: key_statistics(model, w, layer, rng, with_reasoning=flag, batches=cov_batches) for flag in (0, 1)}
    cov = {flag: key_covariance(k) for flag, k in keys.items()}
    out = {"rome": run_parametric(model, suite, "rome", layer, checkpoints, rng, C=cov[0], v_steps=v_steps),
           "rome_call": run_parametric(model, suite, "rome", layer, short_checkpoints, rng, C=cov[1],
                                       v_steps=v_steps),
           "memit": run_parametric(model, suite, "memit", layer, short_checkpoints, rng, C=cov[0],
                                   memit_weight=memit_weight, v_steps=v_steps),
           "alphaedit": run_parametric(model, suite, "alphaedit", layer, short_checkpoints, rng, K0=keys[0],
                                       alpha_tol=alpha_tol, v_steps=v_steps)}
    out["retrieval"] = run_retrieval(model, suite, RetrievalEditor(embed_fn, threshold), short_checkpoints)
    single = single_edit_reliability(model, suite, embed_fn, layer, rng, C=cov[0], K0=keys[0], threshold=threshold,
                                     alpha_tol=alpha_tol, memit_weight=memit_weight, v_steps=v_steps)
    for name, rel in single.items():
        out[name].single = rel
    return out


# ---------------------------------------------------------------------------------------------------------------
# one seed end to end, and the numbers the claims read

TOY_KEYS = ("subjects", "steps", "d_model", "layers", "heads", "d_ff", "edits", "layer", "checkpoints", "short",
            "threshold", "alpha_tol", "memit_weight", "v_steps", "cov_batches")


@dataclass
class ToyRun:
    """One seed of the toy experiment: the world, the trained model, its training losses, the evaluation suite,
    the unedited model's metrics and every editor's trace."""

    world: P.World
    model: Transformer
    losses: list[float]
    suite: Suite
    base: dict[str, float]
    traces: dict[str, Trace]


def toy_run(cfg: Mapping[str, Any], rng: np.random.Generator, embed_fn: Callable, device: torch.device | str = "cpu"
            ) -> ToyRun:
    """The notebook's toy pipeline for one seed: :func:`~.problems.make_world`, :func:`train_toy`,
    :func:`make_suite`, :func:`evaluate` and :func:`compare_editors`, in that order, all drawing on ``rng`` (so
    ``toy_run(cfg, np.random.default_rng(s), ...)`` is the notebook's run with ``SEED = s``). ``cfg`` holds the
    notebook's settings (:data:`TOY_KEYS`; other keys are ignored)."""
    missing = [k for k in TOY_KEYS if k not in cfg]
    if missing:
        raise KeyError(f"toy_run needs the settings {missing}")
    world = P.make_world(cfg["subjects"], rng)
    model, losses = train_toy(world, cfg["steps"], rng, d_model=cfg["d_model"], n_layers=cfg["layers"],
                              n_heads=cfg["heads"], d_ff=cfg["d_ff"], device=device)
    suite = make_suite(world, cfg["edits"], rng, device=device)
    base = evaluate(model, suite, 0)
    traces = compare_editors(model, suite, embed_fn, layer=cfg["layer"], checkpoints=cfg["checkpoints"],
                             short_checkpoints=cfg["short"], threshold=cfg["threshold"], alpha_tol=cfg["alpha_tol"],
                             memit_weight=cfg["memit_weight"], v_steps=cfg["v_steps"], cov_batches=cfg["cov_batches"],
                             rng=rng)
    return ToyRun(world, model, losses, suite, base, traces)


def toy_summary(base: Mapping[str, float], traces: Mapping[str, Trace], layer: int) -> dict[str, Any]:
    """What the notebook's claims read from one seed: the unedited model's lowest accuracy over facts, reasoning and
    the two in-context skills (``base_min``); per editor the reasoning drop in points after the last edit
    (``drop``), the final reliability (``rel``) and its ratio to the single-setting reliability (``kept``, NaN when
    that is 0); for ROME ("rome") the R_k summaries at the edited block (``rk``, one per checkpoint), the last one's
    Spearman(R_k, σ_k) and top-10 % share over chance, the log-log slopes of max and median R_k against T, and
    Spearman(median R_k, reasoning accuracy) over the checkpoints (NaN when either is constant)."""
    rome = traces["rome"]
    rk = [rk_summary(s[layer], r[layer]) for s, r in zip(rome.sigma, rome.R, strict=True)]
    Ts = np.asarray(rome.Ts[1:], dtype=float)
    med, reasoning = np.array([d["median"] for d in rk]), rome.series("reasoning")[1:]
    varies = np.ptp(med) > 0 and np.ptp(reasoning) > 0  # Spearman is undefined for a constant series
    out: dict[str, Any] = {
        "base_min": min(base[k] for k in ("loc", "reasoning", "ctx_rel", "ctx_irr")),
        "drop": {n: 100 * (base["reasoning"] - t.series("reasoning")[-1]) for n, t in traces.items()},
        "rel": {n: float(t.series("rel")[-1]) for n, t in traces.items()},
        "kept": {n: float(t.series("rel")[-1] / t.single) if t.single > 0 else float("nan")
                 for n, t in traces.items()},
        "rk": rk, "spearman": rk[-1]["spearman"], "top_ratio": rk[-1]["top_in_low"] / rk[-1]["chance"],
        "slope_max": loglog_slope(Ts, [d["max"] for d in rk]), "slope_median": loglog_slope(Ts, med),
        "rho_reasoning": float(spearmanr(med, reasoning)[0]) if varies else float("nan"),
    }
    return out
