"""POGO: optimisation over batches of orthogonal (Stiefel) matrices with a tangent step and a normal correction.

Paper: A. Javaloy and A. Vergari, "An Embarrassingly Simple Way to Optimize Orthogonal Matrices at Scale",
ICML 2026 (arXiv 2602.14656); public code ``adrianjav/pogo`` (PyPI ``pogo-torch`` 1.0.2).
Notebook: ``notebooks/19-pogo.ipynb``; benchmark: ``benchmarks/bench_pogo.py``.

Quick start::

    >>> import torch
    >>> from repro.papers import pogo
    >>> _ = torch.manual_seed(0); pca = pogo.PCAProblem.generate(n=20, p=4, cond=10, scale=1)  # min -½tr(WᵀAW)
    >>> W = pca.init().requires_grad_(); opt = pogo.POGO([W], lr=0.5, rows=False)  # W: 20×4, WᵀW = I
    >>> gap0 = pca.gap(W.detach())  # relative optimality gap at the random start
    >>> for _ in range(100): opt.zero_grad(); pca.loss(W).backward(); opt.step()
    >>> print(gap0 > 0.5, pca.gap(W.detach()) < 1e-3, float(pogo.orthogonality_error(W.detach()).max()) < 1e-5)
    True True True

Convention: a parameter holds row-orthonormal matrices ``X`` of shape ``(..., p, n)``, ``p <= n``,
``X Xᵀ = I_p`` (``rows=False``: column-orthonormal ``(..., n, p)``, handled by transposing). One POGO step for
each matrix, with the Euclidean gradient ``G`` (all products batched):

1. base direction ``D = base(G + wd·X)`` (SGD with momentum, VectorAdam, or Muon; the paper lets any Euclidean
   optimiser shape the step);
2. relative gradient ``R = ½ (X Xᵀ D − X Dᵀ X)``, which is ``X·skew(Xᵀ D)`` on the manifold (:func:`relative_gradient`);
3. tangent step ``M = X − lr·R``;
4. normal correction ``X⁺ = M + λ (M − M Mᵀ M)`` with the fixed ``λ = ½`` (:func:`normal_correction`), which is one
   step of the order-1 Newton–Schulz iteration towards the polar factor of ``M``: it maps every singular value
   ``s ↦ 1.5 s − 0.5 s³``, so the distance to the manifold contracts quadratically. Optionally, every
   ``lambda_every`` steps, ``λ`` minimises the quartic ``‖(M + λB)(M + λB)ᵀ − I‖²_F`` (:func:`solve_lambda_quartic`).

The method assumes orthonormal parameters at the start (it never projects), so :class:`POGO` checks them at
the first step and raises a ``ValueError`` naming the error size.

Performance (:func:`pogo_update`): the six products are fused into ``bmm``/``baddbmm`` calls; for square-ish
matrices (``n < 2p``) the relative gradient is ``½ X (Xᵀ D − (Xᵀ D)ᵀ)``, two products instead of four (the same
quantity by associativity); on the CPU the batch is processed in blocks of about 1 MiB
(:data:`CPU_BLOCK_BYTES`) written into the parameter in place, so that the temporaries stay in cache. Without
the blocking, the step on 10⁴ matrices of 16×16 took 15–20× the time of 10³ (every 10 MB temporary streamed
through memory; log-log slope 1.21 from 10² to 10⁴) and POGO's lead over geoopt's QR retraction fell from
3.2–3.6× on 10³ to 2.0–2.6× on 10⁴; blocked, the slope is 0.99 and the lead 5.4–5.8× on 10³ and 4.1–7.8× on 10⁴
(CPU time, one thread, ``benchmarks/bench_pogo.py --growth``; ranges over two runs on a loaded 2-core machine).
For large matrices (``p >= 256``, on the CPU) the two symmetric Grams ``X Xᵀ`` and ``M Mᵀ`` are computed as block
triangles (:func:`gram`): ``10.25 p²n`` FLOPs instead of ``12 p²n`` at 512×1024, a step 1.06–1.10× faster than with
full products on 16×(256×1024), 1×(512×1024) and 1×(1024×4096) (CPU time, one thread, same run), bit for bit the
same result with MKL.
:mod:`.flops` counts the products of every compared method, and why POGO's step cannot drop one.

For comparison, :class:`Landing` (Ablin & Peyré 2022; Ablin et al. 2024) moves along the tangent and the normal
directions at once, ``X⁺ = X − η (R + λ (X Xᵀ − I) X)``, with the "safe" step ``η`` that keeps the distance to the
manifold below ``ε``. Its relative gradient must be the row-aware ``X·skew(Xᵀ G)``: the square-matrix form
``skew(G Xᵀ)·X`` is zero for PCA-type losses on ``p < n`` matrices and silently freezes the method.

Differences from the public code (all deliberate, all tested): the gradient is never modified in place; no step
is skipped for a small gradient (the public code skips a whole parameter when every gradient entry is
``<= 1e-8``); the quartic ``λ`` is the real minimiser of the residual (roots of its cubic derivative) instead of
the real part of the quartic's root with the smallest imaginary part; the Muon base orthogonalises each matrix
(the public one orthogonalises the whole batch as one ``b × pn`` matrix). The SGD base reproduces the public
code's first momentum step, ``(1 + μ − dampening)·g`` (``public_init=True``, the default), so that trajectories
agree step for step; ``public_init=False`` gives PyTorch's ``g``.

Layout: :mod:`.method` (the POGO step, its bases, the optimiser, Landing), :mod:`.problems` (online PCA, batched
Procrustes), :mod:`.baselines` (the compared optimisers behind one name each: pogo-torch, geoopt, Adam + SVD),
:mod:`.experiment` (the notebook's harness), :mod:`.flops` (the FLOPs per step of each method, for the benchmark's
roofline).
"""

from . import flops
from .baselines import *
from .experiment import *
from .method import *
from .problems import *

__all__ = [*baselines.__all__, *experiment.__all__, *method.__all__, *problems.__all__, "flops"]
