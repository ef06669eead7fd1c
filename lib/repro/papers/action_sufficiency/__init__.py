"""Action-sufficient goal representations: exact information gaps on the Discrete Cube and learned encoders.

Paper: J. Hyeon, W. Park, H. Ahn, T. Moon, "Action-Sufficient Goal Representations", ICML 2026
(arXiv 2601.22496). Notebook: ``notebooks/07-gcrl-action-sufficiency.ipynb``.

Quick start::

    >>> import numpy as np, torch
    >>> from repro.papers import action_sufficiency as AS
    >>> env = AS.DiscreteCube(3); s, g = env.valid_pairs()  # the exactly solved two-cube grid, n = 3
    >>> pi, V = env.optimal_action_dist()[s, g], env.values()[s, g]  # π*(a|s,g) and V*(s,g) per valid pair
    >>> phis = AS.anchor_representations(env)[:3]  # Z = (V), Z = (distances), Z = actor-like features
    >>> tasks = env.sample_tasks(100, np.random.default_rng(0)); pol = [AS.mixed_policy(env, p.z) for p in phis]
    >>> success = AS.success_probability(env, torch.stack(pol), tasks)[0].mean(1)  # exact, no rollouts
    >>> for p, sp in zip(phis, success):  # Δ_V = I(V;G|S,Z), Δ_A = I(A;G|S,Z) and exact control success
    ...     t = AS.group_entropies(pi, V, s, p.z)
    ...     print(p.name, round(t["Delta_V"], 3), round(t["Delta_A"], 2), round(float(sp), 2))
    value_only 0.0 0.24 0.69
    distances 0.0 0.11 0.81
    actor_like 0.0 0.0 1.0

A goal representation ``Z = φ(S, G)`` is the interface between a high-level planner and a low-level actor. It is
*value-sufficient* when ``Δ_V = I(V; G | S, Z) = 0`` and *action-sufficient* when ``Δ_A = I(A; G | S, Z) = 0``; the
paper proves the first does not imply the second and shows on an exactly solved two-cube grid ("Discrete Cube")
that control success follows ``Δ_A``, not ``Δ_V``; log-loss training of the actor drives ``Δ_A`` down, so
representations learned through the actor beat those learned through the value function (OGBench).

Public code checked against: github.com/action-sufficient/action-sufficient (JAX), files
``discrete-cube/grid_two_cube_bayes_entropy_pipeline.py`` (MDP, filter, entropies), ``sweep_random_phi_family.py``
(anchors and the random family: same templates and draw order, so seed 0 gives the released family; the released
quadrant counts at n = 3 are reproduced exactly), ``eval_control_success_jax.py`` (tasks, horizon, rollouts),
``plot.py`` (the figure) and ``agents/ota.py`` (length-normalised ``φ([s; g])``, value/actor heads on ``(s, φ)``).

Deliberate deviations:

* Control success is the **exact** expected success of the Bayes policy (dynamic programming on the induced Markov
  chain, :func:`success_probability`), not a 50-rollout estimate; :func:`rollout_success` implements the released
  Monte-Carlo estimator and the tests check that it agrees.
* The released rollout runs every task for the longest task horizon (``max_i min(d*_i + 6, 30)``), although each
  task's own horizon is computed: we follow the released behaviour and also report per-task horizons.
* ``I(A; Z | S, V)`` and ``I(A; V | S, Z)`` are also computed in KL form, so the chain-rule identity is a real check
  (the released code's differences make it hold by construction).
* Learned representations (:func:`train_goal_rep`) are an analogue of the OGBench experiment on the Discrete Cube:
  the actor is fitted to ``π*`` (soft targets) instead of advantage-weighted dataset actions, the value head to the
  exact ``V`` instead of expectile TD targets, on every solvable pair instead of an offline dataset; no high-level
  policy (the goal itself is encoded).

Layout: :mod:`.problems` (the MDP and tasks), :mod:`.method` (information terms, Bayes policies, rollouts, learned
representations), :mod:`.experiment` (the notebook's harness).
"""

from .experiment import *
from .method import *
from .problems import *

__all__ = [*experiment.__all__, *method.__all__, *problems.__all__]
