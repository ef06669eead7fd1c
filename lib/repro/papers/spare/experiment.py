"""Experiment harness of notebook 04: a tiny GPT on MOSES SELFIES, its block activations, SpaRE's concepts, the
steering sweeps with their controls, the readout analysis of the steering direction and the local probe. Every
function that samples takes an explicit seed, so the notebook's numbers do not depend on call order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy import stats

from ...common.nn import Transformer, TransformerConfig
from ...common.train import cosine_schedule, fit
from . import method as M
from .method import Edit, SparseAutoencoder, Tensor, block_outputs, generate_with_edits
from .molecules import Vocab, from_selfies, load_moses, metrics_from_canonical, score, to_selfies

MOLECULE_PROPS = ("logP", "heavy_atoms")


# ----------------------------------------------------------------------------------------------------- data, LM
@dataclass
class MoleculeData:
    """MOSES molecules as SMILES, SELFIES, padded ids ``(N, max_len)``, Crippen logP and heavy-atom counts, and
    the canonical SMILES of the set (the reference of novelty)."""

    smiles: list[str]
    selfies: list[str]
    vocab: Vocab
    ids: Tensor
    props: dict[str, np.ndarray]
    canonical: set[str] = field(repr=False)

    @property
    def lengths(self) -> np.ndarray:
        """Number of SELFIES tokens of each molecule (without ``<bos>``/``<eos>``)."""
        return (self.ids != Vocab.PAD).sum(1).cpu().numpy() - 2


def prepare_data(n: int, seed: int = 0, max_len: int = 64, device: torch.device | str = "cpu") -> MoleculeData:
    """``n`` MOSES training molecules (``load_moses("train", n, seed)``), their SELFIES ids and properties."""
    smiles = load_moses("train", n, seed)
    sfs = to_selfies(smiles)
    vocab = Vocab.build(sfs)
    ids = torch.as_tensor(vocab.encode(sfs, max_len), device=device)
    values, canon = score(smiles, MOLECULE_PROPS)
    return MoleculeData(smiles, sfs, vocab, ids, values, {c for c in canon if c is not None})


def train_lm(data: MoleculeData, *, d_model: int = 96, n_layers: int = 2, n_heads: int = 4, steps: int = 300,
             batch: int = 64, lr: float = 3e-3, warmup: int = 30, seed: int = 0) -> tuple[Transformer, list[float]]:
    """Train a causal :class:`repro.common.nn.Transformer` on the SELFIES ids (next-token cross-entropy, padding
    ignored; AdamW without weight decay, warm-up then cosine decay, clip 1) through :func:`repro.common.train.fit`.
    """
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=len(data.vocab), max_len=data.ids.shape[1], d_model=d_model,
                            n_layers=n_layers, n_heads=n_heads, causal=True)
    model = Transformer(cfg).to(data.ids.device)
    gen = torch.Generator().manual_seed(seed)

    def step_loss(_: int) -> Tensor:
        rows = data.ids[torch.randint(len(data.ids), (batch,), generator=gen).to(data.ids.device)]
        rows = rows[:, : int((rows != Vocab.PAD).sum(1).max())]
        logits = model(rows[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1),
                               ignore_index=Vocab.PAD)

    losses = fit(model, step_loss, steps, lr=lr, optimizer="adamw", weight_decay=0.0,
                 schedule=lambda i: cosine_schedule(i, steps, warmup), clip=1.0)
    return model, losses


@torch.no_grad()
def token_nll(model: Transformer, tokens: Tensor, bos: int, eos: int) -> Tensor:
    """Mean next-token NLL per sequence under ``model`` of generated rows ``(n, T)`` (after ``bos``; up to and
    including the first ``eos``; a row without ``eos`` counts all ``T`` tokens)."""
    seq = torch.cat([torch.full((len(tokens), 1), bos, dtype=torch.long, device=tokens.device), tokens], 1)
    logits = model(seq[:, :-1])
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    logp = torch.log_softmax(logits, -1).gather(-1, seq[:, 1:, None]).squeeze(-1)
    is_eos = (tokens == eos).int()
    keep = ((torch.cumsum(is_eos, 1) - is_eos) == 0).to(logp.dtype)  # no eos strictly before this token
    return -(logp * keep).sum(1) / keep.sum(1)


# ------------------------------------------------------------------------------------------------- activations
@dataclass
class Activations:
    """Block ``layer``'s outputs at every real position of ``n`` molecules: row ``r`` is position ``pos[r]`` of
    molecule ``mol[r]``, holding token ``cur[r]`` and predicting ``nxt[r]`` (the public selector ``"all"``)."""

    layer: int
    z: Tensor
    mol: Tensor
    pos: Tensor
    cur: Tensor
    nxt: Tensor

    @property
    def mean_norm(self) -> float:
        """Mean ``‖z‖`` over rows: the unit of steering strength."""
        return float(self.z.norm(dim=1).mean())

    def rows_of(self, molecules: np.ndarray) -> Tensor:
        """Boolean row mask of the molecules flagged in ``molecules`` (a boolean array over molecules)."""
        return torch.as_tensor(molecules, device=self.mol.device)[self.mol]


@torch.no_grad()
def collect_activations(model: Transformer, data: MoleculeData, layer: int | Sequence[int], n_mol: int
                        ) -> Activations | list[Activations]:
    """Block outputs of the first ``n_mol`` training molecules at every position from ``<bos>`` to the last
    token (the one predicting ``<eos>``). ``layer`` a list: one :class:`Activations` per layer, from a single
    forward pass."""
    layers = [layer] if isinstance(layer, int) else list(layer)
    if not 1 <= n_mol <= len(data.ids):
        raise ValueError(f"n_mol must lie in [1, {len(data.ids)}], got {n_mol}")
    ids = data.ids[:n_mol]
    zs = block_outputs(model, ids[:, :-1], layers)
    real = ids[:, 1:] != Vocab.PAD  # this position predicts a real token
    mol, pos = torch.nonzero(real, as_tuple=True)
    cur, nxt = ids[:, :-1][real], ids[:, 1:][real]
    out = [Activations(i, z[real].contiguous(), mol, pos, cur, nxt) for i, z in zip(layers, zs, strict=True)]
    return out[0] if isinstance(layer, int) else out


def exemplar_molecules(values: np.ndarray, frac: float = 0.2, strata: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Positive / negative molecules: the top / bottom ``frac`` of ``values``; with ``strata`` (e.g. heavy-atom
    counts) the ranking is done within each stratum, so both sets share the strata's distribution
    (length-matched sets). Strata with fewer than 5 molecules are left out."""
    values = np.asarray(values, dtype=float)
    if not 0 < frac < 0.5 or not np.isfinite(values).all():
        raise ValueError("need 0 < frac < 0.5 and finite values")
    groups = np.zeros(len(values)) if strata is None else np.asarray(strata)
    pos, neg = np.zeros(len(values), bool), np.zeros(len(values), bool)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if len(idx) < 5:
            continue
        order = idx[np.argsort(values[idx], kind="stable")]
        c = int(np.floor(frac * len(idx) + 1e-9))  # the same count on both sides of every stratum
        if c:
            neg[order[:c]] = True
            pos[order[-c:]] = True
    return pos, neg


def dense_vector(acts: Activations, pos: Tensor, neg: Tensor) -> Tensor:
    """Dense steering (ActAdd/CAA style): mean positive row minus mean negative row."""
    if not bool(pos.any()) or not bool(neg.any()):
        raise ValueError("empty positive or negative exemplar set")
    return acts.z[pos].mean(0) - acts.z[neg].mean(0)


def cosine(a: Tensor, b: Tensor) -> float:
    """Cosine similarity of two vectors."""
    return float(F.cosine_similarity(a.detach().flatten(), b.detach().flatten(), dim=0))


def with_norm(v: Tensor, norm: float) -> Tensor:
    """``v`` rescaled to norm ``norm``."""
    v = v.detach()
    n = float(v.norm())
    if not n > 0:
        raise ValueError("cannot rescale a zero vector")
    return v * (norm / n)


def gaussian_directions(d: int, k: int, seed: int, like: Tensor) -> list[Tensor]:
    """``k`` isotropic Gaussian directions of unit norm (the null control of a steering vector)."""
    g = torch.Generator().manual_seed(seed)
    return [(x / x.norm()).to(like.device, like.dtype) for x in torch.randn(k, d, generator=g, dtype=torch.float64)]


def random_sae_columns(sae: SparseAutoencoder, k: int, m: int, seed: int) -> list[Tensor]:
    """``k`` means of ``m`` random decoder atoms each: the spec's "random SAE-feature" control (not a null: the
    mean atom points along the mean activation)."""
    g = torch.Generator().manual_seed(seed)
    return [sae.atoms[torch.randperm(sae.latent, generator=g)[:m].to(sae.atoms.device)].mean(0).detach()
            for _ in range(k)]


@torch.no_grad()
def sae_summary(sae: SparseAutoencoder, acts: Tensor, threshold: float = 0.5, batch: int = 8192
                ) -> tuple[dict[str, float], np.ndarray]:
    """Fraction of variance unexplained, mean L0 (nonzero codes per row), the share of rows whose largest code
    reaches ``threshold`` and the median largest code; and the largest code of every row (what the 0.5 rules
    see). One chunked pass; the same sums as :meth:`SparseAutoencoder.fvu_l0`."""
    if len(acts) == 0:
        raise ValueError("no activation rows to summarise")
    mean = acts.mean(0)
    err = var = l0 = 0.0
    tops = []
    for start in range(0, len(acts), batch):
        z = acts[start:start + batch]
        z_hat, h = sae(z)
        err += float(((z - z_hat) ** 2).sum())
        var += float(((z - mean) ** 2).sum())
        l0 += float((h > 0).sum())
        tops.append(h.amax(1))
    top = torch.cat(tops).cpu().numpy()
    return {"fvu": err / var, "l0": l0 / len(acts), "rows_with_code_ge_thr": float((top >= threshold).mean()),
            "median_max_code": float(np.median(top))}, top


# ------------------------------------------------------------------------------------------------------ steering
@dataclass
class Sweep:
    """One row per (vector, strength): mean logP, heavy atoms, logP per heavy atom, NLL under the unedited LM,
    validity, uniqueness, novelty; ``values[(vector, s)]`` keeps the per-molecule logP, heavy-atom counts, logP per
    atom and NLL per token (molecule ``i`` of every batch comes from the same sampling stream)."""

    table: pd.DataFrame
    values: dict[tuple[str, float], dict[str, np.ndarray]]

    def curve(self, name: str, column: str = "logP") -> tuple[np.ndarray, np.ndarray]:
        """Strengths and the column's values of one vector, the shared unedited point included."""
        t = self.table[(self.table.vector == name) | (self.table.strength == 0)].sort_values("strength")
        t = t.drop_duplicates("strength")
        return t.strength.to_numpy(), t[column].to_numpy()

    def spearman(self, name: str, column: str = "logP") -> float:
        """Spearman ρ between strength and the column over the sweep."""
        s, y = self.curve(name, column)
        return float(stats.spearmanr(s, y).statistic)

    def shift(self, name: str, strength: float, column: str = "logP") -> float:
        """Column at ``strength`` minus its unedited value."""
        s, y = self.curve(name, column)
        return float(y[s == strength][0] - y[s == 0][0])

    def span(self, name: str, column: str = "logP") -> float:
        """Largest minus smallest value over the sweep (sign-agnostic size of the effect)."""
        return float(np.ptp(self.curve(name, column)[1]))


def steer_once(model: Transformer, data: MoleculeData, edits: list[Edit], *, n: int, seed: int,
               max_new_tokens: int) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Sample ``n`` molecules under ``edits`` and score them (RDKit on the decoded SELFIES)."""
    v = data.vocab
    gen = generate_with_edits(model, edits, n=n, max_new_tokens=max_new_tokens, bos=v.BOS, eos=v.EOS, seed=seed)
    smiles = from_selfies(v.decode(gen.tokens.cpu().numpy()))
    values, canon = score(smiles, MOLECULE_PROPS)
    values["logP_per_atom"] = values["logP"] / values["heavy_atoms"]
    row = {k: float(np.nanmean(values[k])) for k in ("logP", "heavy_atoms", "logP_per_atom")}
    values["nll"] = token_nll(model, gen.tokens, v.BOS, v.EOS).cpu().numpy()
    row["nll"] = float(values["nll"].mean())
    row.update(metrics_from_canonical(canon, data.canonical))
    return row, values


def sweep(model: Transformer, data: MoleculeData, vectors: dict[str, Tensor], layer: int,
          strengths: list[float], *, n: int, seed: int, max_new_tokens: int,
          base: tuple[dict[str, float], dict[str, np.ndarray]] | None = None) -> Sweep:
    """Global steering: each vector added at block ``layer``'s last position at every step with each strength.
    ``s = 0`` is sampled once (or taken from ``base``, a :func:`steer_once` result with the same seed) and shared;
    all batches use the same sampling seed (common random numbers)."""
    if base is None:
        base = steer_once(model, data, [], n=n, seed=seed, max_new_tokens=max_new_tokens)
    rows = [{"vector": "unedited", "strength": 0.0, **base[0]}]
    values = {("unedited", 0.0): base[1]}
    for name, vec in vectors.items():
        for s in strengths:
            if s == 0:
                continue
            row, vals = steer_once(model, data, [Edit(layer, vec, float(s))], n=n, seed=seed,
                                   max_new_tokens=max_new_tokens)
            rows.append({"vector": name, "strength": float(s), **row})
            values[(name, float(s))] = vals
    return Sweep(pd.DataFrame(rows), values)


@torch.no_grad()
def readout_contrast(model: Transformer, acts: Activations, pos: Tensor, neg: Tensor, v: Tensor,
                     vocab: Vocab) -> pd.DataFrame:
    """Why a contrast vector at the last block steers as it does. Per token: its frequency as the next token in
    positive and negative rows, their log ratio, the contrast of the model's mean log-probability
    ``E_pos log p − E_neg log p``, and the mean change of log p when ``v`` is added to every row (what steering
    does at one step). Tokens that never occur on one side are left out. Needs the last block (the head reads its
    output directly)."""
    if acts.layer != len(model.blocks) - 1:
        raise ValueError("the readout analysis needs the activations of the last block")
    logp = torch.log_softmax(model.head(model.ln_f(acts.z)).float(), -1)
    edited = torch.log_softmax(model.head(model.ln_f(acts.z + v)).float(), -1)
    k = len(vocab)
    f_pos = torch.bincount(acts.nxt[pos], minlength=k).double() / int(pos.sum())
    f_neg = torch.bincount(acts.nxt[neg], minlength=k).double() / int(neg.sum())
    df = pd.DataFrame({
        "token": list(vocab.tokens), "f_pos": f_pos.cpu().numpy(), "f_neg": f_neg.cpu().numpy(),
        "log_freq_ratio": (f_pos / f_neg).log().cpu().numpy(),
        "mean_logp_contrast": (logp[pos].mean(0) - logp[neg].mean(0)).cpu().numpy(),
        "steer_dlogp": (edited - logp).mean(0).cpu().numpy(),
    })
    df = df[(df.f_pos > 0) & (df.f_neg > 0)]  # tokens seen on both sides (a finite log ratio)
    order = np.argsort(-(df.f_pos + df.f_neg).to_numpy(), kind="stable")
    return df.iloc[order].reset_index(drop=True)


# --------------------------------------------------------------------------------------------------- local probe
@torch.no_grad()
def local_probe(model: Transformer, vectors: dict[str, Tensor], layer: int, target: int, steps: list[int],
                strengths: list[float], *, n: int, seed: int, eos: int, bos: int, items: bool = False
                ) -> pd.DataFrame | tuple[pd.DataFrame, dict[tuple[str, float, int], np.ndarray]]:
    """Local control: the probability (mean over ``n`` samples of the unfiltered softmax) and the sampled hit rate
    of ``target`` at generation step ``k`` when the vector is added only at step ``k``. The prefix before ``k``
    is the same unedited sample for every vector and strength (one sampling seed); ``s = 0`` is the base rate.
    Molecules that ended before step ``k`` are left out. ``items=True`` also returns each sample's probability,
    ``{(vector, s, k): (n,) array}`` (NaN for a molecule that ended before ``k``; ``("unedited", 0.0, k)``: the
    base), paired by sample across vectors and strengths."""
    rows, per_item = [], {}
    nan = torch.tensor(float("nan"))
    top = max(steps) + 1
    base = generate_with_edits(model, [], n=n, max_new_tokens=top, bos=bos, eos=eos, seed=seed, return_probs=True)
    for k in steps:
        alive = ~(base.tokens[:, :k] == eos).any(1)  # molecules not finished before step k (same for every edit)
        rows.append({"vector": "unedited", "strength": 0.0, "step": k, "p_target": float(base.probs[alive, k, target]
                     .mean()), "hit_rate": float((base.tokens[alive, k] == target).float().mean())})
        per_item[("unedited", 0.0, k)] = torch.where(alive, base.probs[:, k, target].cpu().double(), nan).numpy()
        for name, vec in vectors.items():
            for s in strengths:
                if s == 0:
                    continue
                g = generate_with_edits(model, [Edit(layer, vec, float(s), step=k)], n=n, max_new_tokens=k + 1,
                                        bos=bos, eos=eos, seed=seed, return_probs=True)
                rows.append({"vector": name, "strength": float(s), "step": k,
                             "p_target": float(g.probs[alive, k, target].mean()),
                             "hit_rate": float((g.tokens[alive, k] == target).float().mean())})
                per_item[(name, float(s), k)] = torch.where(alive, g.probs[:, k, target].cpu().double(), nan).numpy()
    return (pd.DataFrame(rows), per_item) if items else pd.DataFrame(rows)


# ------------------------------------------------------------------------ the claims' items and their statistics
# The claims are decided by repro.common.stats.bootstrap over the generated molecules (local: the sampled
# prefixes): a claim's measurement is a tuple of per-item arrays, one per (direction, strength), all from the same
# sampling streams, so a resample draws the same molecules for every array. A null of K Gaussian directions is
# the tuple of 2K groups (each direction g and its opposite −g, which is g swept at −s), and its statistic is a
# quantile over the groups of the statistic of one group (one group: its value).

def sweep_items(sw: Sweep, name: str, strengths: Sequence[float], column: str = "logP", sign: int = 1
                ) -> tuple[np.ndarray, ...]:
    """Per-molecule ``column`` of vector ``name`` at each strength (``s = 0``: the unedited batch); ``sign=-1``
    gives the opposite direction ``−v`` (the vector at ``−s``)."""
    return tuple(np.asarray(sw.values[("unedited", 0.0) if s == 0 else (name, float(sign * s))][column], float)
                 for s in strengths)


def null_items(sw: Sweep, names: Sequence[str], strengths: Sequence[float], column: str = "logP"
               ) -> tuple[np.ndarray, ...]:
    """:func:`sweep_items` of every direction and of its opposite, concatenated group after group."""
    return tuple(a for name in names for sign in (1, -1) for a in sweep_items(sw, name, strengths, column, sign))


def local_items(items: dict[tuple[str, float, int], np.ndarray], name: str, strength: float, steps: Sequence[int],
                sign: int = 1) -> tuple[np.ndarray, ...]:
    """The base probabilities at each step, then the edited ones (``sign=-1``: the opposite direction)."""
    return (tuple(items[("unedited", 0.0, k)] for k in steps)
            + tuple(items[(name, float(sign * strength), k)] for k in steps))


def local_null_items(items: dict[tuple[str, float, int], np.ndarray], names: Sequence[str], strength: float,
                     steps: Sequence[int]) -> tuple[np.ndarray, ...]:
    """:func:`local_items` of every direction and of its opposite, concatenated group after group."""
    return tuple(a for name in names for sign in (1, -1) for a in local_items(items, name, strength, steps, sign))


def group_means(arrays: Sequence[np.ndarray], group: int) -> np.ndarray:
    """The means (NaN left out) of the arrays, laid out as ``(number of groups, group)``."""
    if group < 1 or not len(arrays) or len(arrays) % group:
        raise ValueError(f"{len(arrays)} arrays do not form groups of {group}")
    return np.nanmean(np.stack([np.asarray(a, float) for a in arrays]), axis=1).reshape(-1, group)


def over_groups(row_stat: Callable[[np.ndarray], np.ndarray], group: int, q: float) -> Callable[..., float]:
    """A bootstrap statistic of a tuple laid out in groups of ``group`` arrays: ``row_stat`` of each group's means
    (one row of :func:`group_means` each), then the ``q``-quantile over the groups (one group: its own value)."""
    if not 0 <= q <= 1:
        raise ValueError("need q in [0, 1]")

    def statistic(*arrays: np.ndarray) -> float:
        return float(np.quantile(row_stat(group_means(arrays, group)), q))

    return statistic


def spearman_rows(strengths: Sequence[float]) -> Callable[[np.ndarray], np.ndarray]:
    """Row statistic: Spearman ρ between ``strengths`` and each row of means (a constant row: 0)."""
    s_rank = stats.rankdata(np.asarray(strengths, float))
    s_c = s_rank - s_rank.mean()

    def row_stat(m: np.ndarray) -> np.ndarray:
        r = stats.rankdata(m, axis=1)
        r_c = r - r.mean(1, keepdims=True)
        den = np.sqrt((r_c ** 2).sum(1) * (s_c ** 2).sum())
        return np.divide((r_c * s_c).sum(1), den, out=np.zeros(len(m)), where=den > 0)

    return row_stat


def shift_rows(m: np.ndarray) -> np.ndarray:
    """Row statistic of (unedited, edited) means: edited minus unedited."""
    if m.shape[1] != 2:
        raise ValueError("expected rows of (unedited, edited) means")
    return m[:, 1] - m[:, 0]


def max_rows(m: np.ndarray) -> np.ndarray:
    """Row statistic: the largest mean of each row."""
    return m.max(1)


def gain_rows(m: np.ndarray) -> np.ndarray:
    """Row statistic of :func:`local_items` means (the base at each step, then the edited): the smallest over
    steps of edited minus base."""
    k = m.shape[1] // 2
    if m.shape[1] != 2 * k or k == 0:
        raise ValueError("expected the base means, then as many edited means")
    return (m[:, k:] - m[:, :k]).min(1)


def expected_best_of(values: np.ndarray, ns: Sequence[int]) -> np.ndarray:
    """Best-of-N rejection sampling from an empirical sample: ``E[max of N draws with replacement]`` for each N,
    exactly (order statistics: ``Σ_i x_(i) ((i/n)^N − ((i−1)/n)^N)``). NaN values are left out."""
    x = np.sort(np.asarray(values, float)[~np.isnan(np.asarray(values, float))])
    if x.size == 0 or any(int(n) < 1 for n in ns):
        raise ValueError("need values and N >= 1")
    i = np.arange(1, x.size + 1) / x.size
    return np.array([float((x * (i ** int(n) - (i - 1 / x.size) ** int(n))).sum()) for n in ns])


def in_range(values: np.ndarray, lo: float, hi: float) -> float:
    """Share of the molecules whose value lies in ``[lo, hi]`` (a NaN value counts as outside)."""
    v = np.asarray(values, float)
    return float(((v >= lo) & (v <= hi)).mean())


# ----------------------------------------------------------------------------------- the rules on data and by hand
def rule_counts(sae: SparseAutoencoder, pos_acts: Tensor, neg_acts: Tensor, local_acts: Tensor,
                threshold: float = 0.5) -> dict[str, float]:
    """What the public 0.5 rules select: the global rule's features (code ≥ ``threshold`` on every positive row,
    below it on every negative row) with the best frequency gap, and the strict local rule's (code ≥ ``threshold``
    in every exemplar row) with the best fraction."""
    frac_pos, _ = sae.code_stats(pos_acts, threshold)
    frac_neg, _ = sae.code_stats(neg_acts, threshold)
    frac_loc, _ = sae.code_stats(local_acts, threshold)
    return {"global": int(((frac_pos >= 1.0 - 1e-12) & (frac_neg <= 1e-12)).sum()),
            "local": int((frac_loc >= 1.0 - 1e-12).sum()),
            "best_gap": float((frac_pos - frac_neg).max()), "best_fraction": float(frac_loc.max())}


def concept_rule_selftest(d: int = 6, seed: int = 0) -> dict[str, bool]:
    """The library's concept rules on constructed codes with known answers: an SAE whose codes are ``ReLU(z)``
    (identity encoder, no normalisation), so the rows are the codes. Feature 2 is planted ≥ 0.6 on every positive
    row and < 0.5 on every negative one; feature 3 ≥ 0.6 in every local exemplar; every other code is < 0.5.
    Returns, per case, whether the rule behaved as specified: the planted features are selected (and nothing
    else), an empty global or local concept raises, and the mean-difference fallback only comes when asked for
    and is labelled."""
    g = np.random.default_rng(seed)
    sae = SparseAutoencoder(d, expansion=1, normalization="none")
    with torch.no_grad():
        sae.encoder.weight.copy_(torch.eye(d))
        sae.encoder.bias.zero_()
        sae.decoder.weight.copy_(torch.as_tensor(g.normal(size=(d, d)), dtype=torch.float32))

    def rows(n: int, planted: int | None) -> Tensor:
        x = g.uniform(0.0, 0.45, (n, d))
        if planted is not None:
            x[:, planted] = g.uniform(0.6, 1.0, n)
        return torch.as_tensor(x, dtype=torch.float32)

    def raises(fn: Callable[[], object]) -> bool:
        try:
            fn()
        except ValueError:
            return True
        return False

    pos, neg, loc = rows(30, 2), rows(25, None), rows(20, 3)
    _, ids_g, mode_g = M.global_concept(sae, pos, neg)
    _, ids_l = M.local_concept(sae, loc)
    empty_pos, empty_loc = rows(30, None), rows(20, None)
    _, ids_f, mode_f = M.global_concept(sae, empty_pos, neg, fallback=True)
    return {
        "global rule selects the planted feature only": ids_g.tolist() == [2] and mode_g.startswith("thresholded"),
        "an empty global concept raises": raises(lambda: M.global_concept(sae, empty_pos, neg)),
        "the fallback comes only when asked, labelled": ids_f.numel() == 0 and mode_f == "mean_decoder_difference",
        "local rule selects the planted feature only": ids_l.tolist() == [3],
        "an empty local concept raises": raises(lambda: M.local_concept(sae, empty_loc)),
    }
