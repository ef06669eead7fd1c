"""Closing the sim-to-real gap in network spreading processes: a batched renewal SIR engine, the stratified
observer, and control.

Paper: "Closing the Sim-to-Real Gap in Network Spreading Processes via Stratified Observation and Distributional
Control" (Shakeri Lab), ICML 2026; reference implementation ``Shakeri-Lab/graph-rl`` (README only was readable) on
the simulator FlashSpread (``Shakeri-Lab/FlashSpread``, arXiv 2604.22092), whose renewal engine and hazards we
read to model ours. Notebook: ``notebooks/08-spreading-control.ipynb``; benchmark: ``benchmarks/bench_spreading.py``.

Quick start::

    >>> import networkx as nx
    >>> from repro.papers import spreading
    >>> G = nx.barabasi_albert_graph(300, 3, seed=0); law = spreading.Weibull(3.0, 5.0)  # non-Markov recovery
    >>> renewal = spreading.RenewalSIR(G, 0.15, law); renewal.reset(300, seed=0)  # 300 replicas, batched
    >>> markov = spreading.RenewalSIR(G, 0.15, law.markov()); markov.reset(300, seed=0)  # exponential, same mean
    >>> a, b = renewal.run(), markov.run()  # final sizes (fraction of nodes ever infected) per replica
    >>> print(a.shape, float(a.mean()) > float(b.mean()) + 0.1)  # the Markov simplification underestimates
    torch.Size([300]) True

Layout: :mod:`.hazards` (holding-time laws), :mod:`.engine` (:class:`RenewalSIR`, :class:`MarkovSIR`: batched
tau-leap over replicas, any device), :mod:`.mean_field` (the mean-field ODE simulator), :mod:`.observation`
(degree tiers, the stratified and the global observers), :mod:`.env` (the control task, the gymnasium environment,
batched policy evaluation), :mod:`.control` (TQC's quantile Huber loss and atom truncation, CEM),
:mod:`.experiment` (the notebook's harness).

Checked against: EoN 2.0 (``fast_nonMarkov_SIR``, ``fast_SIR``, ``SIR_heterogeneous_meanfield``) for the engine
and the ODE; scipy.stats for the hazards; sb3-contrib's ``quantile_huber_loss``; gymnasium's ``check_env``.

Deliberate deviations:

* Fixed tau-leap step ``dt = 0.1`` with the exact per-step recovery probability ``1 − S(a+dt)/S(a)`` instead of
  FlashSpread's adaptive step with ``1 − exp(−h(a)·dt)`` (``rule="hazard"`` is available): measured closer to EoN
  at the same cost. Infections are drawn by Exp(1) thresholds and recoveries by a period drawn at infection; both
  are exact re-expressions of the per-step Bernoulli rules (see :mod:`.engine`).
* The control task (vaccination by degree tier under a dose budget, reward = −attack − cost of doses) is our
  design: the paper's action, "profit" reward and horizon are not public.
* Quick mode optimises constant per-tier intensities by CEM; the paper trains TQC (available in full mode through
  sb3-contrib on :class:`SpreadingControlEnv`).
* The paper's social graphs (Facebook, Twitter, YouTube from SNAP) are not available offline: generated
  Barabási–Albert and Holme–Kim graphs stand in, beside the small real social graphs networkx ships
  (:func:`.experiment.real_graph`: Zachary's karate club, Les Misérables, ...).
"""

from repro.papers import lazy_exports, require

require(__name__, ["networkx"])  # the graphs of the method itself (engine, observers, mean field)

from .control import *
from .engine import *
from .hazards import *
from .mean_field import *
from .observation import *

# The harness and what it compares with import their dependencies on first use (repro.papers.lazy_exports).
_LAZY = {
    "env": [
        "OBSERVERS", "SIMULATORS", "ControlTask", "SpreadingControlEnv", "crn_draws", "hubs_only", "make_simulator",
        "policy_returns", "random_allocation", "rollout",
    ],
    "experiment": [
        "AGREEMENT", "EON_METHODS", "FIXED_POLICIES", "GRAPH_FAMILIES", "REAL_GRAPHS", "Evaluation", "HubBlindness",
        "Outbreaks", "OutbreakStats", "SeedEvaluation", "agreement", "beta_scan", "early_outcome_auc",
        "engine_final_sizes", "eon_final_sizes", "evaluate", "evaluate_seeds", "extinct_share", "hub_blindness",
        "import_eon", "major_mean", "make_graph", "mean_field_curve", "outbreak_stats", "r2_of_sums", "real_graph",
        "record_outbreaks", "seed_policies", "train_cem", "train_sb3",
    ],
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _LAZY)

__all__ = [
    *control.__all__, *engine.__all__, *hazards.__all__, *mean_field.__all__, *observation.__all__,
    *_LAZY["env"], *_LAZY["experiment"],
]
