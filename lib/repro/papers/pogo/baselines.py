"""The optimisers notebook 19 compares, behind one name each: our POGO (three bases) and Landing, the public
``pogo-torch`` (PyPI package ``pogo``), geoopt's Riemannian SGD and Adam with the QR retraction
(``EuclideanStiefel``) or the Cayley retraction (``CanonicalStiefel``), and Euclidean Adam followed by the SVD
projection ``X ← U Vᵀ``. geoopt and pogo-torch are imported only when a baseline needs them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import ModuleType

import torch

from .method import POGO, Landing, SGDBase, Tensor, VectorAdamBase, polar_factor

__all__ = [
    "GEOOPT_METHODS", "METHODS", "POGO_METHODS", "SCALE_METHODS", "import_geoopt", "import_pogo_torch",
    "make_optimizer", "public_base_pair", "stepper",
]

POGO_METHODS = ["POGO (SGD)", "POGO (SGD-mom 0.3)", "POGO (VectorAdam)"]
GEOOPT_METHODS = ["geoopt RSGD (QR)", "geoopt RSGD (Cayley)", "geoopt RAdam (QR)", "geoopt RAdam (Cayley)"]
METHODS = [*POGO_METHODS, "Landing", *GEOOPT_METHODS, "Adam + SVD"]
SCALE_METHODS = ["POGO", "pogo-torch", "Landing", "geoopt RSGD (QR)", "geoopt RSGD (Cayley)"]

_INSTALL = "the POGO baselines need: pip install geoopt==0.5.1 pogo-torch==1.0.2"


def import_pogo_torch() -> tuple[ModuleType, ModuleType]:
    """The public code: the PyPI ``pogo`` package and its ``pogo.base`` (its import of torch.compile warns about
    torch.jit; the warning is silenced)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import pogo
            from pogo import base
    except ImportError as err:
        raise ImportError(_INSTALL) from err
    return pogo, base


def import_geoopt() -> ModuleType:
    """geoopt (Kochurov et al. 2020), the Riemannian baselines (its use of torch.jit.script warns; silenced)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import geoopt
    except ImportError as err:
        raise ImportError(_INSTALL) from err
    return geoopt


def public_base_pair(kind: str, momentum: float = 0.3) -> tuple[SGDBase | VectorAdamBase, object]:
    """Our base optimiser and the public code's equivalent: ``kind`` is ``"sgd"`` (SGD with ``momentum``) or
    ``"vectoradam"``."""
    _, base = import_pogo_torch()
    if kind == "sgd":
        return SGDBase(momentum=momentum), base.SGD(momentum=momentum)
    if kind == "vectoradam":
        return VectorAdamBase(), base.VectorAdam()
    raise ValueError(f"unknown base {kind!r}; valid: 'sgd', 'vectoradam'")


def make_optimizer(method: str, X0: Tensor, lr: float,
                   rows: bool) -> tuple[Tensor, torch.optim.Optimizer, Callable[[Tensor], Tensor] | None]:
    """The parameter (a copy of ``X0``), the optimiser ``method`` (one of :data:`METHODS`) on it, and the
    projection to apply after each step (``None`` but for "Adam + SVD"). ``rows`` is the orientation of ``X0``
    for POGO and Landing; geoopt's Stiefel manifolds are column-orthonormal, so ``X0`` goes to geoopt as it is,
    which needs ``rows=False`` or square matrices."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {METHODS}")
    if method.startswith("geoopt"):
        if rows and X0.shape[-2] != X0.shape[-1]:
            raise ValueError(f"geoopt takes column-orthonormal matrices; got rows=True with shape {tuple(X0.shape)}")
        geoopt = import_geoopt()
        manifold = geoopt.EuclideanStiefel() if "QR" in method else geoopt.CanonicalStiefel()
        X = geoopt.ManifoldParameter(X0.clone(), manifold=manifold)
        cls = geoopt.optim.RiemannianAdam if "RAdam" in method else geoopt.optim.RiemannianSGD
        return X, cls([X], lr=lr), None
    X = X0.clone().requires_grad_()
    if method == "Adam + SVD":
        return X, torch.optim.Adam([X], lr=lr), polar_factor
    if method == "Landing":
        return X, Landing([X], lr=lr, rows=rows), None
    base = {"POGO (SGD)": SGDBase(), "POGO (SGD-mom 0.3)": SGDBase(momentum=0.3),
            "POGO (VectorAdam)": VectorAdamBase()}[method]
    return X, POGO([X], lr=lr, base=base, rows=rows, drift_tol=None), None  # the sweeps watch the drift themselves


def stepper(method: str, X0: Tensor, G: Tensor, lr: float = 0.1) -> Callable[[], object]:
    """One optimiser step of ``method`` (one of :data:`SCALE_METHODS`) on a copy of the square matrices ``X0``
    with the fixed gradient ``G``, for timing: SGD bases throughout, geoopt's Cayley step at ``lr / 2`` (its
    canonical gradient is twice POGO's relative gradient)."""
    if method not in SCALE_METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {SCALE_METHODS}")
    if method.startswith("geoopt"):
        geoopt = import_geoopt()
        manifold = geoopt.EuclideanStiefel() if "QR" in method else geoopt.CanonicalStiefel()
        X = geoopt.ManifoldParameter(X0.clone(), manifold=manifold)
        X.grad = G.clone()
        return geoopt.optim.RiemannianSGD([X], lr=lr if "QR" in method else lr / 2).step
    X = X0.clone().requires_grad_()
    X.grad = G.clone()
    if method == "pogo-torch":
        pogo, base = import_pogo_torch()
        return pogo.POGO([X], base.SGD(), lr).step
    return (POGO([X], lr=lr) if method == "POGO" else Landing([X], lr=lr)).step
