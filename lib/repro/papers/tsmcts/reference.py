"""Gumbel MuZero through DeepMind's ``mctx`` (the paper's "popular modern version of MCTS"), on a tabular model.

``mctx`` (JAX) is imported only when called (:func:`import_mctx`), so the rest of the package works without it.
One ``recurrent_fn`` call is one batched model call, so ``num_simulations`` simulations cost exactly
``num_simulations`` model calls per root, the same currency as the particle searches' ``N · K``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from .method import Diagnostics, SearchResult
from .problems import Network, TabularModel

__all__ = ["gumbel_mcts_reference", "import_mctx"]


def import_mctx() -> tuple[Any, Any, Any]:
    """``(jax, jax.numpy, mctx)``, or an ImportError saying what to install."""
    try:
        import jax
        import jax.numpy as jnp
        import mctx
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("the Gumbel MuZero reference needs `mctx` (pip install mctx==0.0.71, which brings jax); "
                          "the particle searches do not") from err
    return jax, jnp, mctx


@functools.lru_cache(maxsize=8)
def _compiled(num_simulations: int, m: int, max_depth: int | None, gamma: float) -> Any:
    jax, jnp, mctx = import_mctx()

    def recurrent_fn(params: dict, rng_key: Any, action: Any, embedding: Any) -> tuple[Any, Any]:
        del rng_key
        s2 = params["next_state"][embedding, action]
        out = mctx.RecurrentFnOutput(reward=params["reward"][embedding, action],
                                     discount=jnp.full(action.shape, gamma, dtype=params["reward"].dtype),
                                     prior_logits=params["logits"][s2], value=params["value"][s2])
        return out, s2

    def search(params: dict, key: Any, roots: Any) -> Any:
        root = mctx.RootFnOutput(prior_logits=params["logits"][roots], value=params["value"][roots],
                                 embedding=roots)
        out = mctx.gumbel_muzero_policy(params, key, root, recurrent_fn, num_simulations=num_simulations,
                                        max_depth=max_depth, max_num_considered_actions=m)
        tree = out.search_tree
        return (out.action, out.action_weights, tree.node_values[:, 0],
                tree.qvalues(jnp.zeros(roots.shape, dtype=jnp.int32)), tree.summary().visit_counts)

    return jax.jit(search)


def gumbel_mcts_reference(model: TabularModel, net: Network, roots: torch.Tensor, num_simulations: int, m: int = 4,
                          seed: int = 0, max_depth: int | None = None) -> SearchResult:
    """Gumbel MuZero (``mctx.gumbel_muzero_policy``, default completed-Q transform) from each root, on the
    tabular model, in float32 on JAX's default device. Returns the same :class:`SearchResult` as the particle
    searches: ``policy`` is mctx's ``action_weights``, ``value`` the root node value, ``visits`` the root visit
    counts, ``model_calls = num_simulations``; no particles, so no ESS trace (NaN)."""
    if num_simulations < 1:
        raise ValueError(f"num_simulations must be >= 1, got {num_simulations}")
    jax, jnp, _ = import_mctx()
    params = {"next_state": jnp.asarray(model.next_state.cpu().numpy().astype(np.int32)),
              "reward": jnp.asarray(model.reward.cpu().numpy().astype(np.float32)),
              "logits": jnp.asarray(net.logits.cpu().numpy().astype(np.float32)),
              "value": jnp.asarray(net.value.cpu().numpy().astype(np.float32))}
    fn = _compiled(int(num_simulations), int(min(m, model.n_actions)), max_depth, float(model.gamma))
    out = fn(params, jax.random.PRNGKey(seed), jnp.asarray(roots.cpu().numpy().astype(np.int32)))
    action, policy, value, q, visits = (torch.as_tensor(np.array(x)).to(roots.device) for x in out)
    visits = visits.to(torch.float32)
    seen = (visits > 0).sum(-1)
    diag = Diagnostics(int(num_simulations), seen, torch.full((roots.numel(), 1, 1), math.nan),
                       torch.zeros(roots.numel()), seen)
    q = torch.where(visits > 0, q, torch.full_like(q, math.nan))
    return SearchResult(action.long(), policy, value, q, visits, diag)
