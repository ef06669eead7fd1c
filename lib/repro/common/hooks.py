"""Forward hooks for the duration of a ``with`` block, removed on exit also when the body raises: reading what
modules compute (:func:`capture`) and changing it or reacting to it (:func:`hooked`).

Users: :func:`capture`: ``repro.papers.cds`` (paper 02, final-layer states), ``repro.papers.spare`` (paper 04,
block outputs for the SAEs), ``repro.papers.knowedit`` (paper 06, keys and residual streams) and
``repro.papers.sinks`` (paper 10, value vectors); :func:`hooked`: ``repro.papers.knowedit`` (paper 06, ROME's
v* added at the subject position; keys recorded until the forward pass is cut short), ``repro.papers.pace``
(paper 09, counting a block's calls) and ``repro.papers.sinks`` (paper 10, its interventions).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["capture", "hooked"]

Tensor = torch.Tensor


@contextlib.contextmanager
def capture(modules: Mapping[Hashable, nn.Module] | Sequence[nn.Module], *, inputs: bool = False
            ) -> Iterator[dict[Any, Tensor]]:
    """Yields a dict that each forward pass inside the ``with`` fills with the modules' outputs (detached).

    The keys are the mapping's keys, or the positions in the sequence. A module's entry is what it returned (the
    first element where it returns a tuple, as decoder layers do), or with ``inputs=True`` its first positional
    input, read by a forward pre-hook (before the module runs); a module called again overwrites its entry (the
    last call wins). The hooks are appended to the modules' own and removed on exit, also when the body raises.

    Used by ``repro.papers.cds``, ``repro.papers.spare``, ``repro.papers.knowedit`` and ``repro.papers.sinks``.
    """
    items = list(modules.items()) if isinstance(modules, Mapping) else list(enumerate(modules))
    got: dict[Any, Tensor] = {}

    def read_output(key: Hashable) -> Callable[[nn.Module, Any, Any], None]:
        def hook(_module: nn.Module, _inputs: Any, out: Any) -> None:
            got[key] = (out[0] if isinstance(out, tuple) else out).detach()
        return hook

    def read_input(key: Hashable) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            got[key] = args[0].detach()
        return hook

    handles = []
    try:
        for key, module in items:
            if inputs:
                handles.append(module.register_forward_pre_hook(read_input(key)))
            else:
                handles.append(module.register_forward_hook(read_output(key)))
        yield got
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def hooked(modules: Sequence[nn.Module], hook: Callable[..., Any], *, pre: bool = False,
           prepend: bool = False) -> Iterator[None]:
    """Registers ``hook`` on every module for the duration of the ``with`` and removes it on exit, also when the
    body raises: a forward hook ``hook(module, inputs, output)`` (its return value, if not ``None``, replaces the
    output), or with ``pre=True`` a forward pre-hook ``hook(module, inputs)`` (likewise for the inputs).
    ``prepend=True`` runs it before the hooks the modules already have.

    Used by ``repro.papers.knowedit``, ``repro.papers.pace`` and ``repro.papers.sinks``.
    """
    handles = []
    try:
        for m in modules:
            if pre:
                handles.append(m.register_forward_pre_hook(hook, prepend=prepend))
            else:
                handles.append(m.register_forward_hook(hook, prepend=prepend))
        yield
    finally:
        for h in handles:
            h.remove()
