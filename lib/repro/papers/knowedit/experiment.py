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
from scipy.stats import rankdata, spearmanr

from repro.common.hooks import capture
from repro.common.mapping import Mapper, serial_map
from repro.common.nn import Transformer, TransformerConfig
from repro.common.numerics import loglog_slope
from repro.common.train import cosine_schedule, fit

from . import problems as P
from .method import (
    CachedEmbedder,
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

__all__ = [
    "EDITORS", "TOY_KEYS", "ClaimData", "NullControls", "Suite", "ToyRun", "Trace", "block_outputs", "claim_data",
    "compare_editors", "edit_target", "edit_targets", "evaluate", "evaluate_items", "key_statistics", "make_suite",
    "max_slope", "median_slope", "mlp_keys", "random_controls", "random_matrix", "ratio_of_means", "rk_summary",
    "run_parametric", "run_retrieval", "single_edit_hits", "single_edit_reliability", "spearman_rs", "top_ratio",
    "toy_edit", "toy_run", "toy_summary", "toy_train", "train_toy",
]

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


def _hits(model: torch.nn.Module, seqs: Tensor, start: int) -> np.ndarray:
    """Per row: whether greedy decoding of ``seqs[:, start:]`` (answer and EOS) from ``seqs[:, :start]`` is exact."""
    out = P.greedy(model, seqs[:, :start], seqs.shape[1] - start)
    return (out == seqs[:, start:]).all(1).cpu().numpy()


def _answers(model: torch.nn.Module, seqs: Tensor, start: int) -> float:
    """Exact-match accuracy of greedy decoding of ``seqs[:, start:]`` (answer and EOS) from ``seqs[:, :start]``."""
    return float(_hits(model, seqs, start).mean())


def _fact_tensor(world: P.World, s: np.ndarray, r: np.ndarray, o: np.ndarray, device) -> Tensor:
    return torch.as_tensor(P.fact_seqs(world, s, r, o)[0], device=device)


ITEM_KEYS = ("rel", "loc", "reasoning", "ctx_rel", "ctx_irr")


@torch.no_grad()
def evaluate_items(model: torch.nn.Module, suite: Suite, n_done: int) -> dict[str, np.ndarray]:
    """Per item, whether the greedy answer is exact: the first ``n_done`` edits (``rel``), the locality facts,
    the reasoning problems and the two context sets (the items the notebook's bootstraps resample)."""
    w, dev = suite.world, suite.reasoning.device
    e = suite.edits[:n_done]
    return {"rel": _hits(model, _fact_tensor(w, e[:, 0], e[:, 1], e[:, 2], dev), 5) if n_done else np.zeros(0, bool),
            "loc": _hits(model, _fact_tensor(w, suite.loc[:, 0], suite.loc[:, 1],
                                             w.facts[suite.loc[:, 0], suite.loc[:, 1]], dev), 5),
            "reasoning": _hits(model, suite.reasoning, 9), "ctx_rel": _hits(model, suite.ctx_rel, 10),
            "ctx_irr": _hits(model, suite.ctx_irr, 10)}


def _means(items: Mapping[str, np.ndarray]) -> dict[str, float]:
    return {k: float(v.mean()) if v.size else float("nan") for k, v in items.items()}


@torch.no_grad()
def evaluate(model: torch.nn.Module, suite: Suite, n_done: int,
             items: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """Reliability (first ``n_done`` edits), locality, reasoning, in-context overrides, held-out loss (the means of
    :func:`evaluate_items`, which ``items`` may pass in)."""
    out = _means(evaluate_items(model, suite, n_done) if items is None else items)
    tok, mask = suite.heldout
    logits = model(tok[:, :-1])
    out["loss"] = float(torch.nn.functional.cross_entropy(logits[mask[:, :-1]], tok[:, 1:][mask[:, :-1]]))
    return out


@torch.no_grad()
def block_outputs(model: Transformer, tokens: Tensor, mask: Tensor) -> list[Tensor]:
    """Residual stream after each block at the non-pad positions, one ``(n, d)`` matrix per block."""
    with capture(list(model.blocks)) as got:
        model(tokens)
    return [got[i][mask] for i in range(len(model.blocks))]


@torch.no_grad()
def mlp_keys(model: Transformer, layer: int, tokens: Tensor, mask: Tensor) -> Tensor:
    """Inputs of block ``layer``'s MLP output matrix (the keys ``k``) at the non-pad positions."""
    with capture([model.blocks[layer].mlp[2]], inputs=True) as got:
        model(tokens)
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
    items: list[dict[str, np.ndarray]] = field(default_factory=list)  # per T: per-item hits (evaluate_items)
    single_hits: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per edit, applied alone
    dW_norms: list[float] = field(default_factory=list)  # ‖ΔW‖_F of each update applied (one per edit or batch)
    dW_total: list[float] = field(default_factory=list)  # per T >= 1: ‖W_T − W_0‖_F of the edited matrix

    def series(self, key: str) -> np.ndarray:
        return np.array([m[key] for m in self.metrics])


def run_parametric(model: Transformer, suite: Suite, editor: str, layer: int, checkpoints: list[int],
                   rng: np.random.Generator, *, C: Tensor | None = None, K0: Tensor | None = None,
                   alpha_tol: float = 1e-3, memit_weight: float = 1.0, v_steps: int = 50,
                   base_items: dict[str, np.ndarray] | None = None) -> Trace:
    """Apply the suite's edits in order with ROME (one at a time), MEMIT or AlphaEdit (the edits between two
    checkpoints as one batch), evaluating at each checkpoint. Works on a copy of ``model``. ``base_items``: the
    unedited model's :func:`evaluate_items` (computed here if not given)."""
    if editor not in ("rome", "memit", "alphaedit"):
        raise ValueError(f"unknown parametric editor {editor!r}")
    m = copy.deepcopy(model).eval()
    mod = m.blocks[layer].mlp[2]
    H0 = [h.double() for h in block_outputs(m, suite.probe, suite.probe_mask)]
    if editor in ("rome", "memit") and C is None:
        raise ValueError(f"{editor} needs the key covariance C")
    C_inv = torch.linalg.pinv(C).to(mod.weight.dtype) if editor == "rome" else None
    Pj = alphaedit_projector(K0, alpha_tol).to(mod.weight.dtype) if editor == "alphaedit" else None
    items0 = evaluate_items(m, suite, 0) if base_items is None else base_items
    trace = Trace(editor, [0], [evaluate(m, suite, 0, items0)], items=[items0])
    W0 = mod.weight.data.clone()
    done, K_prev = 0, None
    for T in checkpoints:
        while done < T:
            stop = done + 1 if editor == "rome" else T
            K, V = edit_targets(m, suite.world, layer, suite.edits[done:stop], rng, v_steps=v_steps)
            dW = _update(editor, mod.weight.data, K, V, C=C, C_inv=C_inv, proj=Pj, K_prev=K_prev,
                         memit_weight=memit_weight)
            mod.weight.data += dW
            trace.dW_norms.append(float(torch.linalg.matrix_norm(dW.double())))
            if editor == "alphaedit":
                K_prev = K if K_prev is None else torch.cat([K_prev, K])
            done = stop
        trace.Ts.append(T)
        items = evaluate_items(m, suite, T)
        trace.items.append(items)
        trace.metrics.append(evaluate(m, suite, T, items))
        trace.dW_total.append(float(torch.linalg.matrix_norm((mod.weight.data - W0).double())))
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
    retrieval with that one fact in its store). All v* come from the unedited model in one batch. The means of
    :func:`single_edit_hits`."""
    hits = single_edit_hits(model, suite, embed_fn, layer, rng, C=C, K0=K0, threshold=threshold,
                            alpha_tol=alpha_tol, memit_weight=memit_weight, v_steps=v_steps)
    return {k: float(v.mean()) for k, v in hits.items()}


def single_edit_hits(model: Transformer, suite: Suite, embed_fn, layer: int, rng: np.random.Generator, *,
                     C: Tensor, K0: Tensor, threshold: float, alpha_tol: float = 1e-3,
                     memit_weight: float = 1.0, v_steps: int = 50) -> dict[str, np.ndarray]:
    """Per editor and edit, whether that edit applied alone to the unedited model is answered (see
    :func:`single_edit_reliability`)."""
    w = suite.world
    m = copy.deepcopy(model).eval()
    mod = m.blocks[layer].mlp[2]
    K, V = edit_targets(m, w, layer, suite.edits, rng, v_steps=v_steps)
    W0 = mod.weight.data.clone()
    stats = dict(C=C, C_inv=torch.linalg.pinv(C).to(W0.dtype), proj=alphaedit_projector(K0, alpha_tol).to(W0.dtype),
                 K_prev=None, memit_weight=memit_weight)
    facts = [_fact_tensor(w, *(np.array([x]) for x in e), W0.device) for e in suite.edits]
    out: dict[str, np.ndarray] = {}
    try:
        for editor in ("rome", "memit", "alphaedit"):
            hits = []
            for i, seqs in enumerate(facts):
                mod.weight.data = W0 + _update(editor, W0, K[i:i + 1], V[i:i + 1], **stats)
                hits.append(bool(_hits(m, seqs, 5)[0]))
            out[editor] = np.array(hits)
    finally:
        mod.weight.data = W0
    hits = []
    for (s, r, o), seqs in zip(suite.edits, facts, strict=True):
        text = P.render(w, [w.subj(s), w.rel(r), w.obj(o)])
        store = RetrievalEditor(embed_fn, threshold)
        store.add(text)
        hits.append(bool(_gated_hits(model, w, store, {text: (int(s), int(r), int(o))}, seqs, 5)[0][0]))
    out["retrieval"] = np.array(hits)
    return out


@torch.no_grad()
def run_retrieval(model: Transformer, suite: Suite, editor: RetrievalEditor, checkpoints: list[int],
                  base_items: dict[str, np.ndarray] | None = None) -> Trace:
    """The SCR analogue on the unedited weights: store each edit as text; every query (facts, reasoning) goes
    through ``editor``'s gate and, when a stored fact is confirmed, is asked after ``CTX s r o' ;``."""
    w, dev = suite.world, suite.reasoning.device
    index: dict[str, tuple[int, int, int]] = {}
    items0 = evaluate_items(model, suite, 0) if base_items is None else base_items
    trace = Trace("retrieval", [0], [evaluate(model, suite, 0, items0)], items=[items0])
    done = 0
    for T in checkpoints:
        for s, r, o in suite.edits[done:T]:
            text = P.render(w, [w.subj(s), w.rel(r), w.obj(o)])
            index[text] = (int(s), int(r), int(o))
            editor.add(text)
        done = T
        e = suite.edits[:T]
        met: dict[str, float] = {}
        items: dict[str, np.ndarray] = {}
        for name, seqs, start in (
                ("rel", _fact_tensor(w, e[:, 0], e[:, 1], e[:, 2], dev), 5),
                ("loc", _fact_tensor(w, suite.loc[:, 0], suite.loc[:, 1], w.facts[suite.loc[:, 0], suite.loc[:, 1]],
                                     dev), 5),
                ("reasoning", suite.reasoning, 9)):
            items[name], met[name + "_gated"] = _gated_hits(model, w, editor, index, seqs, start)
            met[name] = float(items[name].mean())
        trace.Ts.append(T)
        trace.metrics.append(met)
        trace.items.append(items)
    return trace


def _texts(suite: Suite) -> list[str]:
    """Every text the retrieval editor of :func:`compare_editors` embeds: the edited facts and the rendered edit,
    locality and reasoning queries."""
    w, e, loc = suite.world, suite.edits, suite.loc
    rows = [P.fact_seqs(w, e[:, 0], e[:, 1], e[:, 2])[0][:, :5],
            P.fact_seqs(w, loc[:, 0], loc[:, 1], w.facts[loc[:, 0], loc[:, 1]])[0][:, :5],
            suite.reasoning[:, :9].cpu().numpy()]
    facts = [P.render(w, [w.subj(s), w.rel(r), w.obj(o)]) for s, r, o in e]
    return facts + [P.render(w, row.tolist()) for block in rows for row in block]


def _gated_hits(model: torch.nn.Module, world: P.World, editor: RetrievalEditor, index: dict, seqs: Tensor,
                start: int) -> tuple[np.ndarray, float]:
    """Per prompt, whether the answer is exact when each prompt ``seqs[:, :start]`` is first passed through the
    retrieval gate, and the share of prompts the gate let a stored fact through for."""
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
    return ok.cpu().numpy(), float(hit.float().mean())


# ---------------------------------------------------------------------------------------------------------------
# R_k summaries


def _top_in_low(sigma: np.ndarray, R: np.ndarray, top: float = 0.1) -> tuple[float, float]:
    n = len(sigma)
    k_top, k_low = max(1, int(round(top * n))), max(1, int(round(0.1 * n)))
    top_idx = np.argsort(-R, kind="stable")[:k_top]
    low = np.zeros(n, bool)
    low[np.argsort(sigma, kind="stable")[:k_low]] = True
    return float(low[top_idx].mean()), k_low / n


def rk_summary(sigma: np.ndarray, R: np.ndarray, top: float = 0.1) -> dict[str, float]:
    """Spearman(R_k, σ_k), the share of the top-``top`` R_k directions in the lowest-σ decile (chance: 0.1),
    and max / median R_k."""
    share, chance = _top_in_low(sigma, R, top)
    return {"spearman": float(spearmanr(R, sigma)[0]), "top_in_low": share,
            "chance": chance, "max": float(R.max()), "median": float(np.median(R))}


# the statistics the notebook's bootstraps recompute on each resample (items along axis 0)

def spearman_rs(R: np.ndarray, sigma: np.ndarray) -> float:
    """Spearman(R_k, σ_k) over the directions given (Pearson's r of the average ranks, as ``scipy.stats.spearmanr``;
    the bootstrap calls it thousands of times)."""
    return float(np.corrcoef(rankdata(R), rankdata(sigma))[0, 1])


def top_ratio(R: np.ndarray, sigma: np.ndarray) -> float:
    """Share of the top-10 % R_k directions in the lowest-σ decile, over chance."""
    share, chance = _top_in_low(sigma, R)
    return share / chance


def median_slope(Ts: np.ndarray | list[int]) -> Callable[[np.ndarray], float]:
    """``f(R)``: log-log slope against ``Ts`` of the median over directions of ``R`` (directions × checkpoints)."""
    x = np.asarray(Ts, dtype=float)
    return lambda R: loglog_slope(x, np.median(R, axis=0))


def max_slope(Ts: np.ndarray | list[int]) -> Callable[[np.ndarray], float]:
    """``f(R)``: log-log slope against ``Ts`` of the max over directions of ``R`` (directions × checkpoints)."""
    x = np.asarray(Ts, dtype=float)
    return lambda R: loglog_slope(x, R.max(axis=0))


def ratio_of_means(a: np.ndarray, b: np.ndarray) -> float:
    """``mean(a) / mean(b)`` (NaN when ``mean(b)`` is 0): sequential over single reliability."""
    mb = float(np.mean(b))
    return float(np.mean(a)) / mb if mb > 0 else float("nan")


@dataclass
class NullControls:
    """The trivial alternatives of the R_k and damage claims, measured on the unedited model of one seed:
    ``sigma`` (σ_k of H at the edited block's output) and ``cond`` (σ_max/σ_min); ``R_iso``: R_k after an
    isotropic random ΔW with the Frobenius norm of ROME's final cumulative update; ``R_accum``: per ROME
    checkpoint, R_k after the sum of T random rank-one ΔW with ROME's per-edit norms (random accumulation, √T-like);
    ``reasoning``: per-problem reasoning hits after an isotropic random ΔW with the final cumulative norm of each
    editor (``"rome"``, ``"memit"``)."""

    Ts: list[int]
    sigma: np.ndarray
    cond: float
    R_iso: np.ndarray
    R_accum: np.ndarray  # directions × checkpoints
    reasoning: dict[str, np.ndarray]


def random_matrix(shape: tuple[int, int], norm: float, gen: torch.Generator, rank_one: bool = False) -> Tensor:
    """A random float64 matrix of Frobenius norm ``norm``: isotropic Gaussian, or ``rank_one`` ``g hᵀ`` with
    Gaussian ``g``, ``h`` (a random edit's shape)."""
    if rank_one:
        g = torch.randn(shape[0], generator=gen, dtype=torch.float64)
        h = torch.randn(shape[1], generator=gen, dtype=torch.float64)
        G = torch.outer(g, h)
    else:
        G = torch.randn(shape, generator=gen, dtype=torch.float64)
    return G * (norm / torch.linalg.matrix_norm(G))


@torch.no_grad()
def random_controls(model: Transformer, suite: Suite, layer: int, traces: Mapping[str, Trace],
                    rng: np.random.Generator) -> NullControls:
    """:class:`NullControls` for ``traces["rome"]`` (and ``traces["memit"]``'s norm): random perturbations of the
    edited matrix, drawn from a torch generator seeded by ``rng``, applied to a copy of ``model``."""
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    m = copy.deepcopy(model).eval()
    mod = m.blocks[layer].mlp[2]
    W0 = mod.weight.data.clone()
    H0 = block_outputs(m, suite.probe, suite.probe_mask)[layer].double()

    def rates(dW: Tensor) -> tuple[np.ndarray, np.ndarray]:
        mod.weight.data = W0 + dW.to(W0.device, W0.dtype)
        S, R = relative_change_rates(H0, block_outputs(m, suite.probe, suite.probe_mask)[layer].double() - H0)
        return S.cpu().numpy(), R.cpu().numpy()

    def iso(norm: float) -> Tensor:
        return random_matrix(tuple(W0.shape), norm, gen)

    rome = traces["rome"]
    try:
        sigma, R_iso = rates(iso(rome.dW_total[-1]))
        acc, done, R_acc = torch.zeros(W0.shape, dtype=torch.float64), 0, []
        for T in rome.Ts[1:]:
            for n in rome.dW_norms[done:T]:
                acc += random_matrix(tuple(W0.shape), n, gen, rank_one=True)
            done = T
            R_acc.append(rates(acc)[1])
        reasoning = {}
        for name in ("rome", "memit"):
            if name in traces:
                mod.weight.data = W0 + iso(traces[name].dW_total[-1]).to(W0.device, W0.dtype)
                reasoning[name] = _hits(m, suite.reasoning, 9)
    finally:
        mod.weight.data = W0
    return NullControls(list(rome.Ts[1:]), sigma, float(sigma[0] / sigma[-1]), R_iso, np.stack(R_acc, 1), reasoning)


@dataclass
class ClaimData:
    """The per-item values the notebook's claims resample, from one seed (:func:`claim_data`): per editor the
    reasoning drop per problem in points (``drop``; ``"iso_rome"``/``"iso_memit"``: the random ΔW of that
    editor's norm), the per-edit hits after the last edit (``rel``) and applied alone (``single``), the locality
    change per fact in points (``loc_change``), the most reliable parameter editor (``best``), and R_k (``R``:
    ``"rome"`` after the last edit, ``"iso"``; ``Rmat``: directions × checkpoints for ``"rome"`` and ``"accum"``)
    with ``sigma`` and the checkpoints ``Ts``; ``rho_accum``: Spearman(median R_k of random accumulation, ROME's
    reasoning) over the checkpoints."""

    drop: dict[str, np.ndarray]
    rel: dict[str, np.ndarray]
    single: dict[str, np.ndarray]
    loc_change: dict[str, np.ndarray]
    best: str
    R: dict[str, np.ndarray]
    Rmat: dict[str, np.ndarray]
    sigma: np.ndarray
    Ts: list[int]
    rho_accum: float


def claim_data(traces: Mapping[str, Trace], null: NullControls, layer: int) -> ClaimData:
    """:class:`ClaimData` from every editor's trace and the random controls of one seed."""
    base = traces["rome"].items[0]
    drop = {n: 100.0 * (base["reasoning"].astype(float) - t.items[-1]["reasoning"]) for n, t in traces.items()}
    drop |= {f"iso_{n}": 100.0 * (base["reasoning"].astype(float) - h) for n, h in null.reasoning.items()}
    rel = {n: t.items[-1]["rel"].astype(float) for n, t in traces.items()}
    loc = {n: 100.0 * (t.items[-1]["loc"].astype(float) - base["loc"]) for n, t in traces.items()}
    best = max(("rome", "memit", "alphaedit"), key=lambda n: (rel[n].mean(), n == "rome"))
    rome = traces["rome"]
    Rmat = {"rome": np.stack([r[layer] for r in rome.R], 1), "accum": null.R_accum}
    reasoning = rome.series("reasoning")[1:]
    med = np.median(null.R_accum, axis=0)
    rho = float(spearmanr(med, reasoning)[0]) if np.ptp(med) > 0 and np.ptp(reasoning) > 0 else float("nan")
    return ClaimData(drop, rel, {n: t.single_hits.astype(float) for n, t in traces.items() if t.single_hits.size},
                     loc, best, {"rome": rome.R[-1][layer], "iso": null.R_iso}, Rmat, rome.sigma[-1][layer],
                     list(rome.Ts[1:]), rho)


EDITOR_JOBS = ("rome", "rome_call", "memit", "alphaedit", "retrieval", "single")  # compare_editors' tasks


def compare_editors(model: Transformer, suite: Suite, embed_fn, *, layer: int, checkpoints: list[int],
                    short_checkpoints: list[int], threshold: float, alpha_tol: float, memit_weight: float,
                    v_steps: int, cov_batches: int, rng: np.random.Generator,
                    base_items: dict[str, np.ndarray] | None = None, mapper: Mapper | None = None
                    ) -> dict[str, Trace]:
    """Every editor of the notebook on one trained model: ROME with C from facts and contexts ("rome"), the same
    with C from the full training mix ("rome_call", the control), MEMIT and AlphaEdit (their statistics from
    facts and contexts) and retrieval; each trace's ``single`` is the editor's single-setting reliability
    (:func:`single_edit_hits`; not run for the control).

    The key statistics come from ``rng``; then each of the six jobs (:data:`EDITOR_JOBS`) draws its prompts from a
    generator of its own, seeded from ``rng``, so the jobs are independent: ``mapper`` (``run.map`` in the notebook:
    both cores in quick mode) runs them in any order or in parallel with the same numbers as the plain loop."""
    w = suite.world
    keys = {flag: key_statistics(model, w, layer, rng, with_reasoning=flag, batches=cov_batches) for flag in (0, 1)}
    cov = {flag: key_covariance(k) for flag, k in keys.items()}
    if base_items is None:  # the unedited model's answers, shared by every trace
        base_items = evaluate_items(model.eval(), suite, 0)
    items0 = base_items
    embed_fn = CachedEmbedder(embed_fn)  # every fact and query embedded once, in one batch
    embed_fn.warm(_texts(suite))
    shared = dict(v_steps=v_steps, base_items=items0)
    stats = dict(threshold=threshold, alpha_tol=alpha_tol, memit_weight=memit_weight, v_steps=v_steps)

    def job(task: tuple[str, int]) -> Any:
        name, seed = task
        r = np.random.default_rng(seed)
        if name == "rome":
            return run_parametric(model, suite, "rome", layer, checkpoints, r, C=cov[0], **shared)
        if name == "rome_call":
            return run_parametric(model, suite, "rome", layer, short_checkpoints, r, C=cov[1], **shared)
        if name == "memit":
            return run_parametric(model, suite, "memit", layer, short_checkpoints, r, C=cov[0],
                                  memit_weight=memit_weight, **shared)
        if name == "alphaedit":
            return run_parametric(model, suite, "alphaedit", layer, short_checkpoints, r, K0=keys[0],
                                  alpha_tol=alpha_tol, **shared)
        if name == "retrieval":
            return run_retrieval(model, suite, RetrievalEditor(embed_fn, threshold), short_checkpoints,
                                 base_items=items0)
        return single_edit_hits(model, suite, embed_fn, layer, r, C=cov[0], K0=keys[0], **stats)

    seeds = rng.integers(2**63, size=len(EDITOR_JOBS))
    done = dict(zip(EDITOR_JOBS, (mapper or serial_map)(job, list(zip(EDITOR_JOBS, seeds.tolist(), strict=True))),
                    strict=True))
    single = done.pop("single")
    for name, hits in single.items():
        done[name].single, done[name].single_hits = float(hits.mean()), hits
    return done



# ---------------------------------------------------------------------------------------------------------------
# one seed end to end, and the numbers the claims read

TOY_KEYS = ("subjects", "steps", "d_model", "n_layers", "n_heads", "d_ff", "edits", "layer", "checkpoints", "short",
            "threshold", "alpha_tol", "memit_weight", "v_steps", "cov_batches", "reasoning", "contexts")


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
    null: NullControls | None = None


def toy_run(cfg: Mapping[str, Any], rng: np.random.Generator, embed_fn: Callable, device: torch.device | str = "cpu",
            mapper: Mapper | None = None) -> ToyRun:
    """The notebook's toy pipeline for one seed: :func:`~.problems.make_world`, :func:`train_toy`,
    :func:`make_suite`, :func:`evaluate` and :func:`compare_editors`, in that order, all drawing on ``rng`` (so
    ``toy_run(cfg, np.random.default_rng(s), ...)`` is the notebook's run with ``SEED = s``). ``cfg`` holds the
    notebook's settings (:data:`TOY_KEYS`; other keys are ignored). ``mapper`` runs the editors
    (:func:`compare_editors`), with the same numbers whatever it is."""
    return toy_edit(cfg, *toy_train(cfg, rng, device), rng, embed_fn, device, mapper)


def _check_cfg(cfg: Mapping[str, Any]) -> None:
    missing = [k for k in TOY_KEYS if k not in cfg]
    if missing:
        raise KeyError(f"toy_run needs the settings {missing}")


def toy_train(cfg: Mapping[str, Any], rng: np.random.Generator, device: torch.device | str = "cpu"
              ) -> tuple[P.World, Transformer, list[float]]:
    """The first half of :func:`toy_run`: the world and the trained model with its training losses."""
    _check_cfg(cfg)
    world = P.make_world(cfg["subjects"], rng)
    model, losses = train_toy(world, cfg["steps"], rng, d_model=cfg["d_model"], n_layers=cfg["n_layers"],
                              n_heads=cfg["n_heads"], d_ff=cfg["d_ff"], device=device)
    return world, model, losses


def toy_edit(cfg: Mapping[str, Any], world: P.World, model: Transformer, losses: list[float],
             rng: np.random.Generator, embed_fn: Callable, device: torch.device | str = "cpu",
             mapper: Mapper | None = None) -> ToyRun:
    """The second half of :func:`toy_run` (``rng`` continuing from :func:`toy_train`): the suite, every editor and
    the random controls (:func:`random_controls`)."""
    _check_cfg(cfg)
    suite = make_suite(world, cfg["edits"], rng, n_reasoning=cfg["reasoning"], n_ctx=cfg["contexts"], device=device)
    items0 = evaluate_items(model.eval(), suite, 0)
    base = evaluate(model, suite, 0, items0)
    traces = compare_editors(model, suite, embed_fn, layer=cfg["layer"], checkpoints=cfg["checkpoints"],
                             short_checkpoints=cfg["short"], threshold=cfg["threshold"], alpha_tol=cfg["alpha_tol"],
                             memit_weight=cfg["memit_weight"], v_steps=cfg["v_steps"], cov_batches=cfg["cov_batches"],
                             rng=rng, base_items=items0, mapper=mapper)
    null = random_controls(model, suite, cfg["layer"], traces, rng)
    return ToyRun(world, model, losses, suite, base, traces, null)


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
