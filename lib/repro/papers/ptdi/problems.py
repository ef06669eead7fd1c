"""Test problems for PTDI: synthetic membership-score laws, and a real (small) membership pipeline on
scikit-learn's bundled digits, where the members are an over-fitted network's own training images.

Every sampler draws from a ``torch.Generator`` so that a notebook seeding one reproduces its numbers exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ...common.train import fit

__all__ = [
    "LAWS", "DigitsScores", "ScoreLaw", "auc", "digits_membership", "draw_scores", "resample_membership", "score_law",
]

Tensor = torch.Tensor


@dataclass(frozen=True)
class ScoreLaw:
    """Membership scores: non-members draw from ``base``, members from ``base + shift`` (larger = more
    member-like). ``shift`` is two standard deviations of the base law, so both laws are equally separated in
    that unit; conformal p-values only see ranks, so what differs between the laws is the shape of the tails."""

    name: str
    label: str
    shift: float

    def sample(self, shape: tuple[int, ...], gen: torch.Generator, *, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float64) -> Tensor:
        """Non-member scores of the given shape, drawn on the generator's device and moved to ``device`` (a CPU
        generator gives the same numbers on every device)."""
        z = torch.randn(shape, generator=gen, device=gen.device, dtype=dtype)
        if self.name == "gaussian":
            return z.to(device)
        if self.name == "student-t3":  # t₃ = Z / sqrt(χ²₃ / 3)
            chi2 = torch.randn((*shape, 3), generator=gen, device=gen.device, dtype=dtype).pow(2).sum(-1)
            return (z / torch.sqrt(chi2 / 3.0)).to(device)
        raise ValueError(f"unknown score law {self.name!r}")


LAWS: dict[str, ScoreLaw] = {
    "gaussian": ScoreLaw("gaussian", "Gaussian: N(0,1) vs N(2,1)", 2.0),
    "student-t3": ScoreLaw("student-t3", "heavy-tailed: t₃ vs t₃ + 2√3", 2.0 * math.sqrt(3.0)),
}


def score_law(name: str) -> ScoreLaw:
    """One of :data:`LAWS` by name."""
    if name not in LAWS:
        raise ValueError(f"unknown score law {name!r}; use one of {sorted(LAWS)}")
    return LAWS[name]


def draw_scores(law: str, pi1: float, trials: int, m: int, n: int, gen: torch.Generator, *,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64
                ) -> tuple[Tensor, Tensor, Tensor]:
    """``trials`` independent problems: calibration scores ``(trials, n)`` of known non-members, test scores
    ``(trials, m)`` of which exactly ``round(π₁ m)`` (the first columns) are members, and the member mask."""
    if not 0.0 <= pi1 < 1.0:
        raise ValueError(f"pi1 must lie in [0, 1), got {pi1}")
    if min(trials, m, n) < 1:
        raise ValueError(f"need trials, m, n >= 1, got {trials}, {m}, {n}")
    spec = score_law(law)
    m1 = int(round(pi1 * m))
    cal = spec.sample((trials, n), gen, device=device, dtype=dtype)
    test = spec.sample((trials, m), gen, device=device, dtype=dtype)
    is_member = torch.zeros(trials, m, dtype=torch.bool, device=device)
    is_member[:, :m1] = True
    return cal, test + spec.shift * is_member.to(dtype), is_member


@dataclass
class DigitsScores:
    """Membership scores ``−cross-entropy(true label)`` of an over-fitted classifier for its own training images
    (``member``) and for the held-out images (``nonmember``, the pool that calibration and test non-members are
    drawn from), with its accuracies and final training loss."""

    member: Tensor
    nonmember: Tensor
    train_acc: float
    heldout_acc: float
    final_loss: float


def _mlp(width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    d = 64
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, 10))


def digits_membership(gen: torch.Generator, *, width: int = 512, depth: int = 1, steps: int = 1000,
                      lr: float = 1e-3, member_share: float = 0.2, device: torch.device | str = "cpu",
                      dtype: torch.dtype = torch.float32) -> DigitsScores:
    """The real membership pipeline on scikit-learn's 1797 bundled 8×8 digits.

    A random ``member_share`` of the images trains an over-parameterised MLP (full batch, Adam, no
    regularisation, :func:`repro.common.train.fit`) until it interpolates: these are the members. The other images
    are never seen in training and form the non-member pool from which the calibration set and the test
    non-members are both drawn, so the two are exchangeable, as PTDI requires. Every image is scored by minus its
    cross-entropy, computed in float64 so that tiny training losses do not tie. Parameters are initialised from
    torch's global generator (seeded by ``runtime.setup``); the split comes from ``gen``.
    """
    from sklearn.datasets import load_digits

    if not 0.0 < member_share < 1.0:
        raise ValueError(f"member_share must lie in (0, 1), got {member_share}")
    data = load_digits()
    x = torch.as_tensor(data.data / 16.0, dtype=dtype, device=device)
    y = torch.as_tensor(data.target, dtype=torch.long, device=device)
    perm = torch.randperm(len(y), generator=gen, device=gen.device).to(device)
    n_mem = int(round(member_share * len(y)))
    mem, pool = perm[:n_mem], perm[n_mem:]
    model = _mlp(width, depth).to(device=device, dtype=dtype)
    loss_fn = nn.CrossEntropyLoss()
    log = fit(model, lambda i: loss_fn(model(x[mem]), y[mem]), steps, lr=lr)
    with torch.no_grad():
        logits = model(x).double()
    loss = nn.functional.cross_entropy(logits, y, reduction="none")
    correct = logits.argmax(-1) == y
    return DigitsScores(member=-loss[mem], nonmember=-loss[pool], train_acc=float(correct[mem].double().mean()),
                        heldout_acc=float(correct[pool].double().mean()), final_loss=log[-1])


def resample_membership(member: Tensor, nonmember: Tensor, pi1: float, m: int, n: int, trials: int,
                        gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """``trials`` random splits of fixed score pools (no retraining): a calibration set of ``n`` non-members and a
    test set of ``m`` points, ``round(π₁ m)`` of them members, all drawn without replacement. Returns
    calibration ``(trials, n)``, test ``(trials, m)`` and the member mask (members first)."""
    m1 = int(round(pi1 * m))
    m0 = m - m1
    if not 0.0 <= pi1 < 1.0:
        raise ValueError(f"pi1 must lie in [0, 1), got {pi1}")
    if n < 1 or n + m0 > nonmember.numel() or m1 > member.numel():
        raise ValueError(f"pools too small: need {n} + {m0} non-members (have {nonmember.numel()}) and {m1} "
                         f"members (have {member.numel()})")
    dev = member.device
    pick_non = torch.rand(trials, nonmember.numel(), generator=gen, device=gen.device).argsort(-1).to(dev)
    pick_mem = torch.rand(trials, member.numel(), generator=gen, device=gen.device).argsort(-1).to(dev)
    cal = nonmember[pick_non[:, :n]]
    test = torch.cat([member[pick_mem[:, :m1]], nonmember[pick_non[:, n:n + m0]]], dim=-1)
    is_member = torch.zeros(trials, m, dtype=torch.bool, device=dev)
    is_member[:, :m1] = True
    return cal, test, is_member


def auc(member: Tensor, nonmember: Tensor) -> float:
    """Area under the ROC curve of a score (P(member score > non-member score), ties count ½)."""
    a = member.double().reshape(-1, 1)
    b = nonmember.double().reshape(1, -1)
    return float(((a > b).double() + 0.5 * (a == b).double()).mean())

