"""Linear contracts and Empirical Utility Maximization (EUM).

Paper: M. M. Høgsgaard, "The Optimal Sample Complexity of Linear Contracts", ICML 2026 (arXiv 2601.01496).
Notebook: ``notebooks/05-linear-contracts.ipynb``.

Quick start::

    >>> import numpy as np
    >>> from repro.papers import contracts
    >>> rng = np.random.default_rng(0); pop = contracts.random_population(50, 10, rng=rng)  # 50 types, 10 actions
    >>> emp = pop.empirical(pop.sample_weights(n=2000, reps=1, rng=rng))  # û(α) from 2000 sampled agents
    >>> a_hat, u_hat = emp.eum(); a_star, u_star = pop.truth.eum()  # exact EUM contract, exact optimum
    >>> sup, _ = contracts.sup_deviation(emp, pop.truth)  # sup_α |û(α) − u(α)|, exact
    >>> print(round(float(a_hat), 2), bool(a_hat == a_star), float(sup) < 0.02)
    0.46 True True

Model. An agent type is, for each action ``i``, an expected reward ``R_i ∈ [0, 1]`` (the outcome distribution
``F_i`` integrated against the principal's rewards) and a cost ``c_i ≥ 0``. Under the linear contract
``α ∈ [0, 1]`` the agent earns ``α R_i − c_i`` and best-responds, ties broken in favour of the principal
(the highest ``R_i``). The principal's utility is ``u_θ(α) = (1 − α) R_{i*(α)}`` and the objective is
``u(α) = E_θ u_θ(α)``. EUM returns ``argmax_α (1/N) Σ_j u_{θ_j}(α)``; the paper proves that
``N = O(ln(1/δ)/ε²)`` samples make EUM ε-optimal and, more strongly, ``sup_α |û(α) − u(α)| ≤ ε``
(uniform convergence), with no dependence on the number of actions.

Exact computation (what makes the experiments free of grid error):

* ``R_{i*(α)}`` is a non-decreasing, right-continuous step function: the upper envelope of the lines
  ``α R_i − c_i`` has at most ``k − 1`` breakpoints (:func:`envelope`, a vectorised walk along the envelope).
* A weighted mean of such step functions is again a step function, whose jumps are the union of all
  breakpoints (:func:`mean_reward`). On each piece ``[b_i, b_{i+1})`` the utility ``(1 − α) L_i`` is
  linear and decreasing, so its maximum over the piece is at the left end ``b_i``, where it is attained.
  Hence EUM is a scan over ``{0} ∪ breakpoints`` (:meth:`StepCurves.eum`), and the sup of
  ``|û − u| = (1 − α) |L̂_i − L_i|`` over the piece is also at ``b_i`` (:func:`sup_deviation`):
  both are exact, with no grid.

Everything is batched torch: many types, many weightings (Monte-Carlo repetitions) at once, on any device.

Layout: :mod:`.method` (envelope, step curves, EUM, sup deviation), :mod:`.problems` (populations of types,
and the non-monotone control population of the number-of-actions test), :mod:`.experiment` (the notebook's
harness: per-trial results and their bootstrap estimates).
"""

from .experiment import *
from .method import *
from .problems import *

__all__ = [*experiment.__all__, *method.__all__, *problems.__all__]
