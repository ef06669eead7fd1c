"""Experiment harness of notebook 15: a tiny causal policy, SFT warm start, and GRPO with Prompt-GDRO or
Rollout-GDRO on the heterogeneous modular-sum task (:mod:`.problems`).

Paper: Panaganti et al., arXiv 2601.19280 (ICML 2026). Notebook: ``notebooks/15-grpo-gdro.ipynb``.

* :func:`make_policy`: the shared :class:`repro.common.nn.Transformer` (causal, learned positions).
* :func:`sft`: teacher-forced cross-entropy on correct chains (label smoothing keeps wrong answers possible), through
  :func:`repro.common.train.fit`.
* :func:`sample_chains`: batched rollouts, all prompts x samples of a step in one tensor, KV-cached decoding.
* :func:`train_arm`: GRPO (on-policy, one update per batch, so the PPO ratio is 1 and the clip inactive; no KL) with
  the online difficulty bins, and ``arm`` = ``"grpo"`` (uniform), ``"prompt"`` (Prompt-GDRO advantage scaling) or
  ``"rollout"`` (Rollout-GDRO rollout counts). The update goes through ``fit`` too: its ``step_loss`` closure draws
  the batch, rolls out, runs the controllers and returns the GRPO loss. A warm-up epoch of plain GRPO gives every
  pool prompt a history before the controllers act (the repo would put unseen prompts in the hardest bin).
* :func:`evaluate`: pass@1 and unbiased pass@k (Chen et al. 2021) on fresh prompts, per ``K`` and per group.
* :func:`allocation_stream`: Rollout-GDRO on a :class:`.problems.PassRatePool` (known pass rates, no policy), the
  sigma-variant where the square-root rule can gain; :func:`wse_report` scores either kind of run against uniform.

Random streams: ``data`` (CPU generator: pool, batch order, eval prompts), ``roll`` (a generator on the device:
rollouts, evaluation samples); every arm starts from the same SFT weights and the same streams, so arms see the same
batches in the same order (a paired design) and their step-0 evaluations coincide.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ...common import stats
from ...common.nn import Transformer, TransformerConfig
from ...common.seeding import derive
from ...common.train import fit
from .method import (
    OnlineDifficultyBins,
    PromptGDRO,
    RolloutGDRO,
    allocate_arms,
    grpo_advantages,
    shadow_price_allocation,
    wse,
)
from .problems import GROUPS, ModSumTask, PassRatePool, Prompts

__all__ = [
    "ARM_LABELS", "ARMS", "SIZE_ONLY", "ArmLog", "Evaluation", "Gap", "GRPOConfig", "Setup", "StreamLog", "WSEReport",
    "allocation_stream", "budget_stress", "chain_logprobs", "evaluate", "gaps", "hardest_bin_mass_ratio", "lead_lag",
    "make_policy", "neyman_plan", "pass_at_k", "per_bin_mean", "per_seed", "post_warmup", "prepare", "run_arms",
    "sample_chains", "sft", "summarize", "train_arm", "wse_report",
]

Tensor = torch.Tensor
ARMS = ("grpo", "prompt", "rollout")
ARM_LABELS = {"grpo": "GRPO", "prompt": "Prompt-GDRO", "rollout": "Rollout-GDRO"}
SIZE_ONLY = "size only"  # the shadow Prompt-GDRO fed the batch's mean loss: it sees bin sizes, not difficulty


# ----------------------------------------------------------------------------------------- the policy


def make_policy(task: ModSumTask, d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                device: torch.device | str = "cpu") -> Transformer:
    """The tiny causal policy: :class:`repro.common.nn.Transformer` with learned positions."""
    cfg = TransformerConfig(vocab_size=task.vocab_size, max_len=task.seq_len, d_model=d_model, n_layers=n_layers,
                            n_heads=n_heads, causal=True, positions="learned")
    return Transformer(cfg).to(device)


def chain_logprobs(policy: Transformer, seqs: Tensor, task: ModSumTask) -> Tensor:
    """``(n, k_max, p)`` log-probabilities of the chain tokens given everything before them (teacher forcing),
    restricted to the digit tokens."""
    logits = policy(seqs[:, :-1])[:, task.k_max:, : task.p]
    return F.log_softmax(logits.float(), dim=-1)


def sft(policy: Transformer, task: ModSumTask, steps: int, batch: int, lr: float, generator: torch.Generator,
        label_smoothing: float = 0.1, k_probs: tuple[float, ...] | None = None) -> list[float]:
    """Supervised warm start on fresh correct chains (``K ~ k_probs``, default the task's heavy tail)."""
    device = next(policy.parameters()).device

    def step_loss(_: int) -> Tensor:
        pr = task.make(task.sample_k(batch, generator, k_probs), generator, device)
        lp = chain_logprobs(policy, pr.sequences(), task)
        mask = task.chain_mask(pr.k)
        return F.nll_loss(lp[mask], pr.partial[mask]) if label_smoothing == 0 else \
            F.cross_entropy(lp[mask], pr.partial[mask], label_smoothing=label_smoothing)

    return fit(policy, step_loss, steps, lr=lr, optimizer="adam")


@torch.no_grad()
def sample_chains(policy: Transformer, prompt_tokens: Tensor, task: ModSumTask, generator: torch.Generator,
                  temperature: float = 1.0, chunk: int = 8192) -> Tensor:
    """Sample a chain of ``k_max`` digits for every row of ``prompt_tokens`` (``(n, k_max + 1)``) at
    ``temperature``: one prefix pass with a KV cache, then one token at a time (positions past ``K`` are ignored by
    the reward and the loss). Rows are processed in chunks of ``chunk``."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    outs = []
    for start in range(0, prompt_tokens.shape[0], chunk):
        x = prompt_tokens[start:start + chunk]
        logits, cache = policy(x, return_cache=True)
        toks = []
        for j in range(task.k_max):
            probs = torch.softmax(logits[:, -1, : task.p].float() / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator)
            toks.append(tok)
            if j < task.k_max - 1:
                logits, cache = policy(tok, cache=cache, return_cache=True)
        outs.append(torch.cat(toks, dim=1))
    return torch.cat(outs, dim=0)


# ------------------------------------------------------------------------------------------ evaluation


def pass_at_k(correct: Tensor, m: int, k: int) -> Tensor:
    """Unbiased pass@k from ``correct`` successes out of ``m`` samples: ``1 - C(m - c, k) / C(m, k)``."""
    if not 1 <= k <= m:
        raise ValueError(f"need 1 <= k <= m, got k={k}, m={m}")
    c = correct.to(torch.float64)
    # prod_{i=0}^{k-1} (m - c - i) / (m - i), zero once m - c < k
    i = torch.arange(k, dtype=torch.float64, device=c.device)
    ratio = ((m - c[:, None] - i[None, :]).clamp_min(0) / (m - i[None, :])).prod(dim=1)
    return 1.0 - ratio


@dataclass
class Evaluation:
    """Per-prompt estimates on an evaluation set (``pass1``, ``pass8`` ``(n,)``), their means per ``K`` and per
    group, and the data-weighted overall means (``K`` weighted by the task's heavy tail)."""

    k: np.ndarray
    pass1: np.ndarray
    pass8: np.ndarray
    per_k: dict[str, np.ndarray]
    groups: dict[str, dict[str, float]]
    overall: dict[str, float]

    @property
    def worst(self) -> dict[str, float]:
        """The lowest group mean of each metric."""
        return {m: min(g[m] for g in self.groups.values()) for m in ("pass1", "pass8")}


def summarize(task: ModSumTask, k: np.ndarray, pass1: np.ndarray, pass8: np.ndarray) -> Evaluation:
    """Means per ``K``, per group and overall (data-weighted) of per-prompt estimates."""
    ks = np.arange(1, task.k_max + 1)
    per_k = {m: np.array([v[k == kk].mean() for kk in ks]) for m, v in (("pass1", pass1), ("pass8", pass8))}
    groups = {name: {m: float(per_k[m][lo - 1: hi].mean()) for m in per_k} for name, (lo, hi) in GROUPS.items()}
    w = np.asarray(task.k_probs)
    overall = {m: float((per_k[m] * w).sum()) for m in per_k}
    return Evaluation(k, pass1, pass8, per_k, groups, overall)


@torch.no_grad()
def evaluate(policy: Transformer, task: ModSumTask, prompts: Prompts, samples: int, generator: torch.Generator,
             k_eval: int = 8) -> Evaluation:
    """Sample ``samples`` chains per prompt at temperature 1: pass@1 = mean success, pass@``k_eval`` unbiased."""
    policy.eval()
    rep = prompts.tokens.repeat_interleave(samples, dim=0)
    chains = sample_chains(policy, rep, task, generator)
    ok = task.rewards(prompts.k.repeat_interleave(samples), prompts.answer.repeat_interleave(samples), chains)
    c = ok.view(-1, samples).sum(1)
    p1 = (c.double() / samples).cpu().numpy()
    p8 = pass_at_k(c, samples, k_eval).cpu().numpy()
    return summarize(task, prompts.k.cpu().numpy(), p1, p8)


# ---------------------------------------------------------------------------------------------- GRPO


@dataclass
class GRPOConfig:
    """Settings of one GRPO run (defaults: the notebook's quick mode)."""

    steps: int = 80
    batch: int = 32
    n_bar: int = 4
    lr: float = 1e-3
    clip: float = 1.0
    edges: tuple[float, ...] = (0.1, 0.2, 0.4, 0.6, 0.8, 0.9)
    history: int = 8
    hysteresis: float = 0.03
    arms: tuple[int, ...] = tuple(range(2, 13))
    eta: float = 0.65
    gamma: float = 0.01
    beta: float = 0.12
    w_max: float = 15.0
    dual_lr: float = 0.05
    norm_by_share: bool = True  # the repo's Prompt-GDRO runs (loss_norm_by_class=True)
    eval_every: int = 40
    eval_samples: int = 8
    final_samples: int = 16
    sigma_every: int = 4
    sigma_samples: int = 12


@dataclass
class ArmLog:
    """Per-step logs of one run (``S`` steps, ``B`` bins) and its evaluations."""

    arm: str
    warmup: int
    counts: np.ndarray  # (S, B) prompts per bin
    n_bins: np.ndarray  # (S, B) rollouts per prompt in each bin (0 where empty)
    realised: np.ndarray  # (S,) realised mean rollouts per prompt
    mu: np.ndarray  # (S,) dual price before the step's choice
    q: np.ndarray  # (S, B) Prompt-GDRO's q over the bins present (NaN for other arms)
    mass: np.ndarray  # (S, B) share of the advantage-weight mass per bin
    shadow_mass: dict[str, np.ndarray]  # name -> (S, B) the same for shadow controllers (not applied)
    reward: np.ndarray  # (S, B) mean reward per bin (NaN where empty)
    own_sigma: np.ndarray  # (S, B) sqrt(mean acc (1 - acc)) from the bins' histories
    true_sigma: np.ndarray  # (S, B) independent estimate from fresh samples (NaN off the sigma steps)
    k_in_bin: np.ndarray  # (B, k_max) post-warm-up visits per bin and term count
    loss: np.ndarray  # (S,)
    eval_steps: list[int] = field(default_factory=list)
    eval_rollouts: list[float] = field(default_factory=list)
    evals: list[Evaluation] = field(default_factory=list)
    final: Evaluation | None = None


def _shadows(num_bins: int, cfg: GRPOConfig, device: torch.device) -> dict[str, PromptGDRO]:
    """Prompt-GDRO controllers fed the same batches but never applied: the other ``norm_by_share`` setting, and
    :data:`SIZE_ONLY` (the applied setting fed every prompt the batch's mean loss, so only the bins' sizes differ:
    the control that tells up-weighting by difficulty from up-weighting by rarity)."""
    other = "unnormalised" if cfg.norm_by_share else "share-normalised"
    return {name: PromptGDRO(num_bins, cfg.eta, cfg.gamma, cfg.beta, w_max=cfg.w_max, norm_by_share=norm,
                             device=device)
            for name, norm in ((other, not cfg.norm_by_share), (SIZE_ONLY, cfg.norm_by_share))}


def _epoch_batches(n_pool: int, batch: int, steps: int, generator: torch.Generator) -> list[Tensor]:
    """Uniform prompt sampling: shuffled passes over the pool, cut into batches."""
    out, cur = [], torch.empty(0, dtype=torch.long)
    while len(out) < steps:
        while cur.numel() < batch:
            cur = torch.cat([cur, torch.randperm(n_pool, generator=generator)])
        out.append(cur[:batch])
        cur = cur[batch:]
    return out


def _independent_sigma(policy: Transformer, task: ModSumTask, pr: Prompts, bins: Tensor, num_bins: int,
                       samples: int, generator: torch.Generator) -> Tensor:
    """Per-bin sigma from fresh samples: per prompt the unbiased ``pi (1 - pi)`` estimate ``c (m - c) / (m (m -
    1))``, averaged over the bin's prompts, square root."""
    rep = pr.tokens.repeat_interleave(samples, dim=0)
    chains = sample_chains(policy, rep, task, generator)
    c = task.rewards(pr.k.repeat_interleave(samples), pr.answer.repeat_interleave(samples), chains)
    c = c.view(-1, samples).sum(1).double()
    var = c * (samples - c) / (samples * (samples - 1))
    return _bin_mean(var, bins, num_bins).clamp_min(0).sqrt()


def _bin_mean(x: Tensor, bins: Tensor, num_bins: int) -> Tensor:
    n = torch.bincount(bins, minlength=num_bins).double()
    s = torch.zeros(num_bins, dtype=torch.float64, device=x.device).index_add_(0, bins, x.double())
    return torch.where(n > 0, s / n.clamp_min(1), torch.full_like(s, math.nan))


def train_arm(arm: str, policy: Transformer, task: ModSumTask, pool: Prompts, eval_prompts: Prompts,
              cfg: GRPOConfig, seed: int, final_prompts: Prompts | None = None,
              initial: Evaluation | None = None) -> ArmLog:
    """GRPO from ``policy`` (modified in place) with the given controller; see the module docstring.

    The learning curve evaluates ``eval_prompts`` with ``cfg.eval_samples`` samples every ``cfg.eval_every`` steps
    (``initial`` replaces the step-0 evaluation when given: it is the same for every arm); the last point is the
    final evaluation of ``final_prompts`` (default ``eval_prompts``) with ``cfg.final_samples`` samples."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    device = next(policy.parameters()).device
    data = torch.Generator().manual_seed(seed)
    roll = torch.Generator(device=device).manual_seed(seed)
    ev_gen = torch.Generator(device=device).manual_seed(derive(seed, "eval"))  # evaluation samples, apart from training
    warmup = math.ceil(len(pool) / cfg.batch)
    if cfg.steps <= warmup:
        raise ValueError(f"steps={cfg.steps} must exceed the warm-up epoch ({warmup} steps)")
    batches = _epoch_batches(len(pool), cfg.batch, cfg.steps, data)
    bins = OnlineDifficultyBins(len(pool), cfg.edges, cfg.history, cfg.hysteresis, device)
    nb = bins.num_bins
    pg = PromptGDRO(nb, cfg.eta, cfg.gamma, cfg.beta, w_max=cfg.w_max, norm_by_share=cfg.norm_by_share,
                    device=device)
    rg = RolloutGDRO(nb, cfg.arms, cfg.n_bar, cfg.eta, cfg.gamma, cfg.dual_lr, device=device)
    S = cfg.steps
    nan = np.full((S, nb), np.nan)
    shadows = _shadows(nb, cfg, device)
    log = ArmLog(arm, warmup, np.zeros((S, nb), int), np.zeros((S, nb), int), np.zeros(S), np.zeros(S),
                 nan.copy(), nan.copy(), {k: nan.copy() for k in shadows}, nan.copy(), nan.copy(), nan.copy(),
                 np.zeros((nb, task.k_max), int), np.zeros(S))
    consumed = [0.0]

    def record_eval(step: int, ev: Evaluation) -> None:
        log.eval_steps.append(step)
        log.eval_rollouts.append(consumed[0])
        log.evals.append(ev)

    def step_loss(i: int) -> Tensor:
        if i % cfg.eval_every == 0:
            use_initial = i == 0 and initial is not None
            record_eval(i, initial if use_initial else evaluate(policy, task, eval_prompts, cfg.eval_samples, ev_gen))
            policy.train()
        pr = pool.take(batches[i].to(device))
        b = bins.bins(pr.uid)
        acc = bins.accuracy(pr.uid)
        counts = torch.bincount(b, minlength=nb)
        active = i >= warmup
        log.mu[i] = rg.mu
        n_bin = rg.choose(counts) if (arm == "rollout" and active) else torch.where(counts > 0, cfg.n_bar, 0)
        n_i = n_bin[b]
        # rollouts: prompts x samples flattened into one tensor
        group = torch.arange(len(pr), device=device).repeat_interleave(n_i)
        chains = sample_chains(policy, pr.tokens[group], task, roll)
        r = task.rewards(pr.k[group], pr.answer[group], chains)
        adv = grpo_advantages(r, group)
        mean_r = torch.zeros(len(pr), device=device).index_add_(0, group, r) / n_i
        loss_i = 1.0 - mean_r  # prompt-level loss signal (see the notebook: the ratio-1 surrogate is 0)
        w = torch.ones(len(pr), device=device)
        if active and arm == "prompt":
            w = pg.weights(b).to(w.dtype)  # from the scores up to the previous step (repo order)
            log.q[i] = pg.q(counts > 0).cpu().numpy()
            for name, ctl in shadows.items():
                ws = ctl.weights(b)
                log.shadow_mass[name][i] = (_bin_mean(ws, b, nb).nan_to_num(0.0) * counts / ws.sum()).cpu().numpy()
        bin_loss = _bin_mean(loss_i, b, nb)
        if active:
            pg.update(b, loss_i)
            for name, ctl in shadows.items():
                ctl.update(b, loss_i.mean().expand_as(loss_i) if name == SIZE_ONLY else loss_i)
            if arm == "rollout":
                rg.update(bin_loss)
            np.add.at(log.k_in_bin, (b.cpu().numpy(), pr.k.cpu().numpy() - 1), 1)
            if arm == "rollout" and (i - warmup) % cfg.sigma_every == 0:
                log.true_sigma[i] = _independent_sigma(policy, task, pr, b, nb, cfg.sigma_samples,
                                                       roll).cpu().numpy()
        bins.update(pr.uid, mean_r)
        # GRPO surrogate at ratio 1: per prompt, the mean over its rollouts of -A * (token-mean log-prob)
        seqs = torch.cat([pr.tokens[group], chains], dim=1)
        lp = chain_logprobs(policy, seqs, task).gather(2, chains[:, :, None])[:, :, 0]
        mask = task.chain_mask(pr.k[group])
        tok_mean = (lp * mask).sum(1) / mask.sum(1)
        per_prompt = torch.zeros(len(pr), device=device).index_add_(0, group, -adv * tok_mean) / n_i
        loss = (w * per_prompt).mean()
        # logs
        log.counts[i] = counts.cpu().numpy()
        log.n_bins[i] = n_bin.cpu().numpy()
        log.realised[i] = float(n_i.double().mean())
        log.mass[i] = (_bin_mean(w, b, nb).nan_to_num(0.0) * counts / w.sum()).cpu().numpy()
        log.reward[i] = _bin_mean(mean_r, b, nb).cpu().numpy()
        log.own_sigma[i] = _bin_mean(acc * (1 - acc), b, nb).clamp_min(0).sqrt().cpu().numpy()
        log.loss[i] = float(loss.detach())
        consumed[0] += float(n_i.sum())
        return loss

    fit(policy, step_loss, cfg.steps, lr=cfg.lr, optimizer="adam", clip=cfg.clip)
    log.final = evaluate(policy, task, final_prompts if final_prompts is not None else eval_prompts,
                         cfg.final_samples, ev_gen)
    record_eval(cfg.steps, log.final)
    return log


@dataclass
class Setup:
    """One seed's starting point: the SFT policy, its loss curve, the training pool (stable ids), the evaluation
    prompts of the learning curves, the final evaluation prompts (fresh, never trained on) and the post-SFT
    evaluation."""

    seed: int
    base: Transformer
    sft_loss: list[float]
    pool: Prompts
    eval_prompts: Prompts
    final_prompts: Prompts
    initial: Evaluation


def prepare(task: ModSumTask, seed: int, *, sft_steps: int, sft_batch: int, sft_lr: float,
            sft_probs: tuple[float, ...] | None, label_smoothing: float, d_model: int, n_layers: int, n_heads: int,
            pool_size: int, eval_per_k: int, final_per_k: int, eval_samples: int,
            device: torch.device | str = "cpu") -> Setup:
    """Seed, build and SFT-warm-start the policy; draw the pool and the fresh evaluation prompts (the curve's set is
    the first ``eval_per_k`` prompts per ``K`` of the final set); evaluate the SFT policy."""
    torch.manual_seed(seed)
    data = torch.Generator().manual_seed(seed)
    base = make_policy(task, d_model, n_layers, n_heads, device)
    losses = sft(base, task, sft_steps, sft_batch, sft_lr, data, label_smoothing, sft_probs)
    pool = task.pool(pool_size, data, device)
    final = task.per_k(final_per_k, data, device)
    first = torch.cat([torch.arange(k * final_per_k, k * final_per_k + eval_per_k) for k in range(task.k_max)])
    ev = final.take(first.to(device))
    gen = torch.Generator(device=device).manual_seed(derive(seed, "eval"))
    return Setup(seed, base, losses, pool, ev, final, evaluate(base, task, ev, eval_samples, gen))


def run_arms(setup: Setup, task: ModSumTask, cfg: GRPOConfig, arms: Sequence[str] = ARMS) -> dict[str, ArmLog]:
    """Every arm from a copy of the SFT policy with the same seed (a paired design); the step-0 evaluation is the
    shared post-SFT one."""
    return {arm: train_arm(arm, copy.deepcopy(setup.base), task, setup.pool, setup.eval_prompts, cfg, setup.seed,
                           setup.final_prompts, setup.initial) for arm in arms}


# --------------------------------------------------------------------------------------- diagnostics


def per_bin_mean(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per bin, the mean of ``values`` (``(S, B)``) over the steps where the bin held prompts (``counts > 0``);
    NaN for a bin that was always empty."""
    live = counts > 0
    total = np.where(live, np.nan_to_num(values), 0.0).sum(0)
    n = live.sum(0)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def post_warmup(log: ArmLog) -> slice:
    """The steps where the controllers act."""
    return slice(log.warmup, len(log.realised))


def hardest_bin_mass_ratio(log: ArmLog, shadow: str | None = None) -> np.ndarray:
    """Per post-warm-up step: weight mass / data share of the hardest bin present in the batch (of the shadow
    controller named ``shadow``, a key of ``log.shadow_mass``, when given)."""
    c = log.counts[post_warmup(log)]
    m = (log.mass if shadow is None else log.shadow_mass[shadow])[post_warmup(log)]
    first = (c > 0).argmax(1)
    rows = np.arange(len(c))
    return m[rows, first] / (c[rows, first] / c.sum(1))


def lead_lag(log: ArmLog) -> np.ndarray:
    """Paper Fig. 6a: ``Delta mu(t)`` = mean bin index under the weight mass minus under the data share."""
    c = log.counts / log.counts.sum(1, keepdims=True)
    idx = np.arange(c.shape[1])
    return (np.nan_to_num(log.mass) * idx).sum(1) - (c * idx).sum(1)


def neyman_plan(counts: np.ndarray, sigma: np.ndarray, arms: Sequence[int], n_bar: int) -> np.ndarray:
    """The square-root rule bounded to the arms' range (:func:`shadow_price_allocation`), then integerised by
    :func:`allocate_arms` (utility ``-c_b (n - n_b*)^2``, exact budget): the variance-optimal plan for ``sigma``."""
    c = torch.as_tensor(counts, dtype=torch.float64)
    s = torch.as_tensor(np.nan_to_num(sigma), dtype=torch.float64).clamp_min(1e-6)
    live = c > 0
    target = torch.zeros_like(c)
    target[live], _ = shadow_price_allocation(c[live], s[live] ** 2, float(n_bar), float(min(arms)),
                                              float(max(arms)))
    a = torch.tensor(list(arms), dtype=torch.float64)
    util = -(c[:, None] * (a[None, :] - target[:, None]) ** 2)
    idx, _ = allocate_arms(c.long(), arms, util, int(c.sum()) * n_bar)
    return np.where(idx.numpy() >= 0, np.asarray(arms)[idx.clamp_min(0).numpy()], 0)


@dataclass
class WSEReport:
    """WSE per sigma step (scored with the independent sigma): the run's allocation, uniform, the square-root plan
    from the controller's own sigma, and the oracle square-root plan from the independent sigma; and the run's
    allocation scored with its own sigma (the diagnostic)."""

    steps: np.ndarray
    run: np.ndarray
    uniform: np.ndarray
    plan_own: np.ndarray
    oracle: np.ndarray
    run_own: np.ndarray
    uniform_own: np.ndarray

    def frac_below(self, a: np.ndarray, b: np.ndarray) -> float:
        return float((a < b).mean())

    def reduction(self, a: np.ndarray, b: np.ndarray) -> float:
        """Mean relative reduction ``1 - a / b`` in percent."""
        return float(100 * (1 - a / b).mean())

    def changes(self) -> dict[str, float]:
        """Mean WSE change against uniform, ``100 (WSE / WSE_uniform - 1)`` averaged over the steps, in percent (the
        unit of the paper's Fig. 6b: negative is lower than uniform) for the run, the square-root plan from the
        controller's own sigma and the oracle square-root plan."""
        return {k: -self.reduction(getattr(self, k), self.uniform) for k in ("run", "plan_own", "oracle")}


def wse_report(log: ArmLog | StreamLog, arms: Sequence[int], n_bar: int) -> WSEReport:
    """WSE against uniform on every post-warm-up step with an independent sigma (:class:`WSEReport`); steps where
    every bin has zero estimated variance (WSE 0 for any allocation) are left out."""
    has = ~np.isnan(log.true_sigma).all(1)
    unif = (log.counts * np.nan_to_num(log.true_sigma)).sum(1)
    steps = np.nonzero(has & (unif > 0))[0]  # steps with a sigma estimate and some variance
    rows = {k: [] for k in ("run", "uniform", "plan_own", "oracle", "run_own", "uniform_own")}
    for t in steps:
        c = log.counts[t]
        q = torch.as_tensor(c / c.sum())
        live = c > 0
        sig = torch.as_tensor(np.nan_to_num(log.true_sigma[t]))
        own = torch.as_tensor(np.nan_to_num(log.own_sigma[t]))
        n_run = torch.as_tensor(np.where(live, log.n_bins[t], n_bar), dtype=torch.float64)
        plans = {"plan_own": neyman_plan(c, log.own_sigma[t], arms, n_bar),
                 "oracle": neyman_plan(c, log.true_sigma[t], arms, n_bar)}
        rows["run"].append(float(wse(q, sig, n_run)))
        rows["uniform"].append(float(wse(q, sig, torch.full_like(n_run, n_bar))))
        for k, n in plans.items():
            rows[k].append(float(wse(q, sig, torch.as_tensor(np.where(live, n, n_bar), dtype=torch.float64))))
        rows["run_own"].append(float(wse(q, own, n_run)))
        rows["uniform_own"].append(float(wse(q, own, torch.full_like(n_run, n_bar))))
    return WSEReport(steps, **{k: np.array(v) for k, v in rows.items()})


# ---------------------------------------------------------------------------- the sigma-variant (no policy)


@dataclass
class StreamLog:
    """Per-step logs of :func:`allocation_stream` (``S`` steps, ``B`` bins); the fields :func:`wse_report` reads
    have the meaning they have in :class:`ArmLog`, and ``true_sigma`` is exact (from the known pass rates)."""

    warmup: int
    counts: np.ndarray  # (S, B) prompts per bin
    n_bins: np.ndarray  # (S, B) rollouts per prompt in each bin
    realised: np.ndarray  # (S,) realised mean rollouts per prompt
    mu: np.ndarray  # (S,) dual price before the step's choice
    own_sigma: np.ndarray  # (S, B) sqrt(mean acc (1 - acc)) from the bins' histories
    true_sigma: np.ndarray  # (S, B) sqrt(mean pi (1 - pi)) over the bin's prompts (NaN where empty or warm-up)
    pass_rate: np.ndarray  # (S,) mean pass rate of the pool


def allocation_stream(pool: PassRatePool, cfg: GRPOConfig, seed: int, steps: int, kappa: float = 0.15,
                      device: torch.device | str = "cpu") -> StreamLog:
    """Rollout-GDRO on a pool of known pass rates: the online bins, the controller and its feedback exactly as in
    :func:`train_arm`, with the policy replaced by the pool.

    Per step a batch of ``cfg.batch`` prompts (shuffled passes over the pool; the first pass is uniform, the
    warm-up), ``n_b`` rollouts per prompt of bin ``b`` (``cfg.n_bar`` during the warm-up), successes ~
    Binomial(``n_i``, ``pi_i``), the loss ``1 - mean reward`` per prompt as the controller's feedback. Learning is a
    stand-in: a prompt whose group is mixed (some but not all rollouts correct: a non-zero GRPO advantage) has its
    logit raised by ``kappa``, so the frontier drifts towards solved; solved and unsolved prompts never move.
    """
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    pi = pool.sample(gen).to(dev)
    warmup = math.ceil(pool.n / cfg.batch)
    if steps <= warmup:
        raise ValueError(f"steps={steps} must exceed the warm-up epoch ({warmup} steps)")
    batches = _epoch_batches(pool.n, cfg.batch, steps, gen)
    bins = OnlineDifficultyBins(pool.n, cfg.edges, cfg.history, cfg.hysteresis, dev)
    nb = bins.num_bins
    rg = RolloutGDRO(nb, cfg.arms, cfg.n_bar, cfg.eta, cfg.gamma, cfg.dual_lr, device=dev)
    nan = np.full((steps, nb), np.nan)
    log = StreamLog(warmup, np.zeros((steps, nb), int), np.zeros((steps, nb), int), np.zeros(steps),
                    np.zeros(steps), nan.copy(), nan.copy(), np.zeros(steps))
    for t in range(steps):
        uid = batches[t].to(dev)
        b, acc = bins.bins(uid), bins.accuracy(uid)
        counts = torch.bincount(b, minlength=nb)
        log.mu[t] = rg.mu
        n_bin = rg.choose(counts) if t >= warmup else torch.where(counts > 0, cfg.n_bar, 0)
        n_i = n_bin[b].to(torch.float64)
        p = pi[uid]
        succ = torch.binomial(n_i.cpu(), p.cpu(), generator=gen).to(dev)
        mean_r = succ / n_i
        if t >= warmup:
            rg.update(_bin_mean(1.0 - mean_r, b, nb))
        bins.update(uid, mean_r)
        log.counts[t] = counts.cpu().numpy()
        log.n_bins[t] = n_bin.cpu().numpy()
        log.realised[t] = float(n_i.mean())
        if t >= warmup:  # as in train_arm: sigma is scored where the controller acts
            log.true_sigma[t] = _bin_mean(p * (1 - p), b, nb).sqrt().cpu().numpy()
        log.own_sigma[t] = _bin_mean(acc * (1 - acc), b, nb).clamp_min(0).sqrt().cpu().numpy()
        log.pass_rate[t] = float(pi.mean())
        mixed = (succ > 0) & (succ < n_i)
        pi[uid] = torch.where(mixed, torch.sigmoid(torch.logit(p) + kappa), p)
    return log


# ----------------------------------------------------------------------------------- compute neutrality


def budget_stress(counts: np.ndarray, bin_losses: np.ndarray, arms: Sequence[int], n_bar: int,
                  dual_lr: float, eta: float = 0.65, gamma: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """Replay a run's per-step bin counts and losses through a fresh :class:`RolloutGDRO` with ``arms`` (chosen so
    that the budget often has no exact split) and return the realised mean rollouts and the dual price per step."""
    rg = RolloutGDRO(counts.shape[1], arms, n_bar, eta, gamma, dual_lr)
    realised, mus = [], []
    for c, lb in zip(counts, bin_losses, strict=True):
        mus.append(rg.mu)
        rg.choose(torch.as_tensor(c))
        realised.append(rg.update(torch.as_tensor(lb)))
    return np.array(realised), np.array(mus)


# --------------------------------------------------------------------------------------- comparisons


@dataclass
class Gap:
    """Arm minus GRPO: the mean, a 95 % interval and what the interval is over."""

    mean: float
    lo: float
    hi: float
    over: str

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0


def per_seed(runs: Sequence[dict[str, ArmLog]], arm: str, metric: str, group: str | None = None) -> np.ndarray:
    """One value per seed of ``arm``'s final evaluation: the data-weighted ``metric`` (``"pass1"`` / ``"pass8"``)
    or, with ``group``, that group's mean."""
    return np.array([r[arm].final.overall[metric] if group is None else r[arm].final.groups[group][metric]
                     for r in runs])


def _weighted_gap(task: ModSumTask, ev_a: Evaluation, ev_b: Evaluation, metric: str, ks: Sequence[int]) -> Gap:
    """Paired difference over the same evaluation prompts, stratified by ``K`` and weighted as :func:`summarize`
    weights it (the heavy tail over all ``K``; equal weights within a group): ``sum_k W_k mean_k(d)`` with standard
    error ``sqrt(sum_k W_k^2 var_k(d) / n_k)``."""
    d = getattr(ev_a, metric) - getattr(ev_b, metric)
    w = np.array([task.k_probs[kk - 1] for kk in ks]) if len(ks) == task.k_max else np.ones(len(ks))
    w = w / w.sum()
    strata = [d[ev_a.k == kk] for kk in ks]
    mean = float(sum(wk * s.mean() for wk, s in zip(w, strata, strict=True)))
    lo, hi = stats.normal_interval(mean, stats.stratified_se(strata, w))
    return Gap(mean, lo, hi, "evaluation prompts (one seed)")


def gaps(task: ModSumTask, runs: Sequence[dict[str, ArmLog]], arm: str, group: str | None = None) -> dict[str, Gap]:
    """``arm`` minus GRPO on the final evaluation: overall pass@1 / pass@8 and ``group``'s pass@1 / pass@8 (keys
    ``worst_*``; default: the group where the first seed's GRPO has the lowest pass@1).

    With several seeds the interval is a t interval over the per-seed paired differences (training noise); with one
    seed it is over the evaluation prompts only (evaluation noise: it says nothing about seed-to-seed variation)."""
    out = {}
    worst_name = group or min(GROUPS, key=lambda g: runs[0]["grpo"].final.groups[g]["pass1"])
    worst_ks = list(range(GROUPS[worst_name][0], GROUPS[worst_name][1] + 1))
    for metric in ("pass1", "pass8"):
        for key, ks in ((f"overall_{metric}", list(range(1, task.k_max + 1))), (f"worst_{metric}", worst_ks)):
            if len(runs) == 1:
                out[key] = _weighted_gap(task, runs[0][arm].final, runs[0]["grpo"].final, metric, ks)
                continue
            d = []
            for r in runs:
                a, g = r[arm].final, r["grpo"].final
                if key.startswith("overall"):
                    d.append(a.overall[metric] - g.overall[metric])
                else:
                    d.append(a.groups[worst_name][metric] - g.groups[worst_name][metric])
            est = stats.over_seeds(d)
            out[key] = Gap(est.value, est.lo, est.hi, f"{len(d)} seeds (paired)")
    return out
