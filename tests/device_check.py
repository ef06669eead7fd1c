"""Run a core on a device and classify what happened: the CPU-only check of CUDA readiness (issue 42, item 3).

``run_on(device, fn)`` calls ``fn(device)``. On ``"meta"`` (always available) every tensor the core creates
correctly (``device=device``, ``.to(device)``, modules moved with ``.to(device)``) is a meta tensor without data; a
tensor created on the default device (CPU) inside the device-aware path then meets a meta tensor and torch raises
``Tensor on device cpu is not on the expected device meta!``: a leak.

Meta tensors hold no data. Where data would only decide a check or a selection, the watch makes it up, always the
same way, and counts it (``assumed``): ``bool()`` of an ``any``/``all``/``isclose``/``allclose``/``equal`` result
reads "the input passes" (False for ``any``, True for the others), a boolean mask selects every element, ``unique``
finds every element distinct, ``bincount(minlength=n)`` nothing beyond ``n``; at most ``MAX_ASSUMED`` per part, so
that a loop the made-up data keeps going ends. Anything else that needs data stops the core (``DATA_STOPS``, by
exact message: ``.item()``/``float()``/``int()``, ``.cpu()``, ``.numpy()``, ops without a Meta kernel ...); so does,
once values were made up, any error that is not a device error. A stop ends the current :func:`part` of a case (or
the case), is recorded with its ``file:line``, and the case goes on; the test then requires that at least
``min_ops`` aten operations ran on meta, so that the check is not vacuous.

Three leaks do not raise on meta but would on CUDA; the watches catch them while the core runs:

* an operation that mixes a meta tensor with a CPU tensor of one or more dimensions (``mm``, ``index_add``, ...):
  meta's kernels do not all check devices, CUDA's do. Exempt: copies (``.to``, ``copy_``, ``x[i] = cpu``) and
  indexing with a CPU index tensor, which CUDA accepts;
* a random operation on the target device that draws from a CPU ``torch.Generator`` (CUDA needs a CUDA generator).
  ``torch.Generator(device="meta")`` does not exist, so during a meta run ``torch.Generator`` is replaced by a
  subclass whose meta generators are CPU generators that report ``device == meta``;
* a returned tensor that is not on the target device.

Outcome ``status``: ``"complete"``, ``"stopped"`` (``stop``: each stop with its site) or ``"leak"`` (``leaks``: each
with the innermost ``lib/repro`` frame, ``file:line``). On ``"cuda"`` nothing is made up and nothing may stop: the
call must complete with every returned tensor on CUDA. :func:`moved` hands a problem built on the CPU (by code that
needs data) to the device-aware method.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

LIB = str(Path(__file__).resolve().parents[1] / "lib" / "repro")

# The data-dependent stops accepted on meta: (exception type, exact message prefix). Nothing else.
DATA_STOPS: tuple[tuple[type[BaseException], str], ...] = (
    (RuntimeError, "Tensor.item() cannot be called on meta tensors"),  # .item(), float(), int(), bool(), if t:
    (NotImplementedError, "Cannot copy out of meta tensor; no data!"),  # .tolist(), .cpu(), .to("cpu")
    (TypeError, "can't convert meta device type tensor to numpy."),  # .numpy(), np.asarray
    (NotImplementedError, "The register_meta function for torch.nonzero() raises unimplemented by default"),
    (RuntimeError, "cannot repeat_interleave a meta tensor without output_size"),  # output size = data
    (TypeError, "unsupported format string passed to Tensor.__format__"),  # f"{t:.3f}" of a meta scalar
    (AssertionError, "generator is not supported in refs"),  # meta's exponential_ etc. take no generator
)
NO_META_KERNEL = "attempted to run this operator with Meta tensors, but there was no fake impl or Meta kernel"

# Device-mismatch errors: any of these raised during the call is a leak.
LEAK_MESSAGES = (
    "is not on the expected device",
    "Expected all tensors to be on the same device",
    "expected to be in the same device",
    "device type for generator",
    "must be on the same device",
)

COPY_OPS = {"_to_copy", "copy_", "copy", "_copy_from", "_copy_from_and_resize", "lift_fresh", "lift_fresh_copy"}
INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"}
MIN_OPS = 5
MAX_ASSUMED = 100  # made-up values per part (see _Watch)


@dataclasses.dataclass
class Outcome:
    """What ``run_on`` saw: ``status`` in {"complete", "stopped", "leak"}."""

    device: str
    status: str
    meta_ops: int
    assumed: int = 0  # values made up on meta (see the module docstring)
    result: Any = None
    stop: str = ""  # the accepted data-dependent error, with its site
    leaks: list[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        """One line for assertion messages and the report."""
        extra = self.stop if self.status == "stopped" else "; ".join(self.leaks)
        checks = f" ({self.assumed} values made up)" if self.assumed else ""
        return f"{self.device}: {self.status} after {self.meta_ops} ops{checks} {extra}".strip()


def site(frames: list[traceback.FrameSummary]) -> str:
    """The innermost frame inside ``lib/repro`` (else the innermost outside torch) as ``path:line (code)``."""
    ours = [f for f in frames if f.filename.startswith(LIB)]
    if not ours:
        ours = [f for f in frames if "/torch/" not in f.filename and not f.filename.endswith("device_check.py")]
    if not ours:
        return "?"
    f = ours[-1]
    path = f.filename[len(str(Path(LIB).parents[1])) + 1:] if f.filename.startswith(LIB) else f.filename
    return f"{path}:{f.lineno} ({(f.line or '').strip()})"


def _devices(values: Any) -> set[str]:
    """Device types of the tensors among ``values``, leaving out 0-dim CPU tensors (torch lets them mix)."""
    out = set()
    for t in tree_leaves(values):
        if isinstance(t, torch.Tensor) and not (t.device.type == "cpu" and t.dim() == 0):
            out.add(t.device.type)
    return out


class AssumptionsExhausted(RuntimeError):
    """More than ``MAX_ASSUMED`` made-up values in one run (a loop that the assumptions keep going)."""


def _all_true(mask: torch.Tensor) -> list[torch.Tensor]:
    """The indices of ``mask`` as if every element were True (long, on ``mask``'s device)."""
    return [i.to(mask.device) for i in torch.ones(mask.shape, dtype=torch.bool).nonzero().unbind(1)]


def _expand_masks(indices: list[Any]) -> list[Any]:
    out: list[Any] = []
    for ix in indices:
        boolean = isinstance(ix, torch.Tensor) and ix.is_meta and ix.dtype in (torch.bool, torch.uint8)
        out += _all_true(ix) if boolean else [ix]
    return out


class _Watch(TorchDispatchMode):
    """Counts the aten ops that touch the target device and records mixed-device ones (see the module doc).

    On meta it also makes up what data would decide, always the same way: ``bool()`` of an ``any``/``all``/
    ``isclose`` result reads False/True/True (the input passes the core's checks), and a boolean mask selects every
    element (``nonzero``, ``x[mask]``, ``x[mask] = v``, ``masked_select``); ``unique`` finds every element distinct;
    ``bincount(x, minlength=n)`` finds nothing beyond ``n``.
    """

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target, self.ops, self.assumed, self.leaks = target, 0, 0, []
        self.budget = MAX_ASSUMED  # made-up values left to the running part
        self._verdicts: dict[int, tuple[weakref.ref, bool]] = {}

    def assume(self) -> None:
        self.assumed += 1
        self.budget -= 1
        if self.budget < 0:
            raise AssumptionsExhausted(f"more than {MAX_ASSUMED} made-up values in one part")

    def _made_up(self, name: str, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """(True, value) when the op reads meta data that the assumptions decide."""
        if not args or not isinstance(args[0], torch.Tensor) or not args[0].is_meta:
            return False, None
        x = args[0]
        if name == "_local_scalar_dense":
            ref, verdict = self._verdicts.get(id(x), (None, None))
            if ref is None or ref() is not x:
                return False, None
            return True, verdict
        if name in ("nonzero", "argwhere"):
            if not x.dim():
                return True, torch.zeros(1, 0, dtype=torch.long, device=x.device)
            return True, torch.stack(_all_true(x), 1)
        if name == "masked_select":
            return True, x.expand(torch.broadcast_shapes(x.shape, args[1].shape)).reshape(-1).clone()
        if name == "_unique2":
            inverse = torch.empty(x.shape, dtype=torch.long, device=x.device)
            counts = torch.ones(x.numel() if args[3:4] == (True,) or kwargs.get("return_counts") else 0,
                                dtype=torch.long, device=x.device)
            return True, (x.reshape(-1).clone(), inverse, counts)
        if name == "bincount" and (args[2:3] or (kwargs.get("minlength", 0),))[0] > 0:
            weights = args[1] if len(args) > 1 else kwargs.get("weights")
            dtype = weights.dtype if weights is not None else torch.long
            return True, torch.zeros((args[2:3] or (kwargs["minlength"],))[0], dtype=dtype, device=x.device)
        return False, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = func._overloadpacket.__name__
        made, value = self._made_up(name, args, kwargs)
        if made:
            self.assume()
            self.ops += 1
            return value
        if name in ("index", "index_put", "index_put_", "_index_put_impl_") and any(
                isinstance(i, torch.Tensor) and i.is_meta and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            self.assume()
            args = (args[0], _expand_masks(list(args[1])), *args[2:])
        out = func(*args, **kwargs)
        seen = _devices((args, kwargs))
        if self.target in seen or self.target in _devices(out):
            self.ops += 1
        if self.target != "cpu" and {self.target, "cpu"} <= seen and name not in COPY_OPS | INDEX_OPS:
            self.leaks.append(f"{name} mixes {self.target} and cpu tensors at {site(traceback.extract_stack())}")
        if name in ("any", "all") and isinstance(out, torch.Tensor) and out.is_meta:
            self.verdict(out, name == "all")
        return out

    def verdict(self, t: torch.Tensor, value: bool) -> None:
        """``bool(t)`` (``t`` meta, all of its elements) reads ``value``."""
        if t.dim() == 0:
            self._verdicts[id(t)] = (weakref.ref(t), value)


class _Functions(TorchFunctionMode):
    """Records random ops on the target device that draw from a CPU generator not standing for it; on meta, marks
    ``isclose`` results as passed checks (see :class:`_Watch`)."""

    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        target, gen = self.watch.target, kwargs.get("generator")
        if isinstance(gen, torch.Generator) and gen.device.type != target:
            dev = kwargs.get("device")
            if target in ({torch.device(dev).type} if dev is not None else _devices(args)):
                self.watch.leaks.append(f"{getattr(func, '__name__', func)} on {target} draws from a "
                                        f"{gen.device.type} generator at {site(traceback.extract_stack())}")
        name = getattr(func, "__name__", "")
        if name in ("allclose", "equal") and "meta" in _devices(args):  # C++ reads these without a Python tensor
            self.watch.assume()
            return True
        out = func(*args, **kwargs)
        if name == "isclose" and isinstance(out, torch.Tensor) and out.is_meta:
            self.watch.verdict(out, True)
        return out


@contextlib.contextmanager
def _meta_generators() -> Iterator[None]:
    """Let ``torch.Generator(device="meta")`` work: a CPU generator marked as standing for meta."""
    base = torch.Generator

    class _Meta(type(base)):
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, base)

    class StandIn(base, metaclass=_Meta):
        def __new__(cls, device: Any = None) -> torch.Generator:
            meta = device is not None and torch.device(device).type == "meta"
            gen = base.__new__(cls, device="cpu" if meta else (device or "cpu"))
            gen.meta = meta
            return gen

        def __init__(self, device: Any = None) -> None:
            pass

        @property
        def device(self) -> torch.device:
            return torch.device("meta") if self.meta else base.device.__get__(self)

    torch.Generator = StandIn
    try:
        yield
    finally:
        torch.Generator = base


def tensors_of(result: Any) -> list[torch.Tensor]:
    """Every tensor in ``result`` (pytrees, dataclasses, modules' parameters and buffers)."""
    found: list[torch.Tensor] = []
    stack = [result]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, nn.Module):
            found.extend(x.state_dict().values())
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
    return found


def moved(obj: Any, device: str | torch.device) -> Any:
    """A copy of ``obj`` with every tensor on ``device`` (modules by ``.to``; ``repro`` objects and dataclasses
    attribute by attribute, a ``device`` attribute included): for a problem built on the CPU by data-dependent code
    (which cannot run on meta) and then handed to the device-aware method."""
    dev = torch.device(device)
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, nn.Module):
        return copy.deepcopy(obj).to(dev)
    if isinstance(obj, torch.device):
        return dev
    if isinstance(obj, list | tuple) and not hasattr(obj, "_fields"):
        return type(obj)(moved(x, dev) for x in obj)
    if isinstance(obj, dict):
        return {k: moved(v, dev) for k, v in obj.items()}
    ours = type(obj).__module__.startswith("repro.") or dataclasses.is_dataclass(obj)
    if not ours or isinstance(obj, type) or not hasattr(obj, "__dict__"):
        return obj
    new = copy.copy(obj)
    for key, value in vars(obj).items():
        object.__setattr__(new, key, moved(value, dev))
    return new


def _is_data_stop(err: BaseException) -> bool:
    msg = str(err)
    if any(m in msg for m in LEAK_MESSAGES):
        return False
    if isinstance(err, NotImplementedError) and NO_META_KERNEL in msg:
        return True
    return any(isinstance(err, kind) and msg.startswith(text) for kind, text in DATA_STOPS)


def _describe(err: BaseException) -> str:
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"{first[:90]} at {site(traceback.extract_tb(err.__traceback__))}"


_RUN = threading.local()  # the watch and the stops of the run_on in progress (meta only)


def _stop_of(err: BaseException) -> str | None:
    """The recorded stop when ``err`` ends a part on meta, else None: a data-dependent operation; or, once values
    were made up (see :class:`_Watch`), any error but a device error (the made-up data may break the core)."""
    watch = getattr(_RUN, "watch", None)
    if watch is None or any(m in str(err) for m in LEAK_MESSAGES):
        return None
    if _is_data_stop(err) or isinstance(err, AssumptionsExhausted):
        return _describe(err)
    if watch.assumed:
        return f"on made-up data: {type(err).__name__}: {_describe(err)}"
    return None


def part(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` inside a case; on meta, a stop (see :func:`_stop_of`) or a device error ends this part
    only (recorded, result ``None``) and the case goes on with its next part. Other errors propagate."""
    watch = getattr(_RUN, "watch", None)
    budget = watch.budget if watch is not None else 0
    if watch is not None:
        watch.budget = MAX_ASSUMED
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        if watch is not None and any(m in str(err) for m in LEAK_MESSAGES):
            _RUN.leaks.append(f"{type(err).__name__}: {_describe(err)}")
            return None
        stop = _stop_of(err)
        if stop is None:
            raise
        _RUN.stops.append(stop)
        return None
    finally:
        if watch is not None:
            watch.budget = budget


def run_on(device: str | torch.device, fn: Callable[[torch.device], Any]) -> Outcome:
    """Call ``fn(device)`` under the watches and classify the outcome (see the module docstring)."""
    dev = torch.device(device)
    watch = _Watch(dev.type)
    gens = _meta_generators() if dev.type == "meta" else contextlib.nullcontext()
    result, leaks, stops = None, [], []
    _RUN.watch, _RUN.stops, _RUN.leaks = (watch, stops, leaks) if dev.type == "meta" else (None, None, None)
    try:
        with gens, _Functions(watch), watch:
            result = fn(dev)
    except Exception as err:  # noqa: BLE001 - classified below, re-raised when unknown
        stop = _stop_of(err)
        if any(m in str(err) for m in LEAK_MESSAGES):
            leaks.append(f"{type(err).__name__}: {_describe(err)}")
        elif stop is not None:
            stops.append(stop)
        else:
            raise
    finally:
        _RUN.watch = _RUN.stops = _RUN.leaks = None
    leaks = watch.leaks + leaks
    leaks += [f"returned a tensor on {t.device}" for t in tensors_of(result) if t.device.type != dev.type][:1]
    status = "leak" if leaks else "stopped" if stops else "complete"
    return Outcome(str(dev), status, watch.ops, watch.assumed, result, "; ".join(stops), leaks)


def check(device: str | torch.device, fn: Callable[[torch.device], Any], min_ops: int = MIN_OPS) -> Outcome:
    """``run_on`` plus the assertions of the device tests: no leak; on meta at least ``min_ops`` ops ran; on any
    other device the call completes."""
    out = run_on(device, fn)
    assert out.status != "leak", f"device leak: {out.describe()}"
    if out.device == "meta":
        assert out.meta_ops >= min_ops, f"vacuous: {out.describe()}"
    else:
        assert out.status == "complete", out.describe()
    return out
