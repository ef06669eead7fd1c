"""Molecules for paper 04: MOSES SMILES from the ``molsets`` wheel, SELFIES tokens, RDKit properties and the
generation metrics (validity, uniqueness, novelty).

Data: the MOSES benchmark (Polykovskiy et al. 2020) ships its splits inside the ``molsets`` wheel as
``moses/dataset/data/{train,test,test_scaffolds}.csv.gz``. ``import moses`` fails on current RDKit (its SA scorer
imports the removed ``rdkit.six``) and would pull heavy metrics, so the files are found through
``importlib.util.find_spec("moses")``, which locates the package without executing its ``__init__``.
Tokens: plain SELFIES (Krenn et al. 2020) from the ``selfies`` package; the paper uses Group SELFIES, which is not
on PyPI. Properties: RDKit's Crippen logP (``Descriptors.MolLogP``), TPSA and QED.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import selfies as sf
from rdkit import Chem, RDLogger
from rdkit.Chem import QED, Descriptors

RDLogger.DisableLog("rdApp.*")

SPLITS = ("train", "test", "test_scaffolds")
PROPERTIES = ("logP", "TPSA", "QED", "heavy_atoms")


def _mol(smiles: str):
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    return None if mol is None or mol.GetNumAtoms() == 0 else mol


def moses_file(split: str) -> str:
    """Path of a MOSES split inside the installed ``molsets`` wheel (never imports ``moses``)."""
    if split not in SPLITS:
        raise ValueError(f"unknown MOSES split {split!r}; use one of {SPLITS}")
    spec = importlib.util.find_spec("moses")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the MOSES data needs the 'molsets' wheel: pip install --no-deps molsets==0.3.1")
    path = os.path.join(spec.submodule_search_locations[0], "dataset", "data", f"{split}.csv.gz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"MOSES split {split!r} missing from the molsets wheel ({os.path.basename(path)})")
    return path


def load_moses(split: str = "train", n: int | None = None, seed: int = 0) -> list[str]:
    """``n`` SMILES drawn without replacement from a MOSES split (``numpy.random.default_rng(seed)``), in the
    order drawn; ``n=None`` returns the whole split in file order."""
    smiles = pd.read_csv(moses_file(split), usecols=["SMILES"])["SMILES"].to_numpy()
    if n is None:
        return smiles.tolist()
    if not 1 <= n <= len(smiles):
        raise ValueError(f"n must lie in [1, {len(smiles)}] for split {split!r}, got {n}")
    idx = np.random.default_rng(seed).choice(len(smiles), size=n, replace=False)
    return smiles[idx].tolist()


def to_selfies(smiles: Sequence[str]) -> list[str]:
    """SELFIES strings of SMILES (``selfies.encoder``); an unencodable SMILES is an error naming it."""
    out = []
    for s in smiles:
        enc = sf.encoder(s)
        if enc is None:
            raise ValueError(f"SELFIES cannot encode {s!r}")
        out.append(enc)
    return out


def from_selfies(strings: Sequence[str]) -> list[str]:
    """SMILES decoded from SELFIES strings (``selfies.decoder``; valid by construction, possibly empty)."""
    return [sf.decoder(s) or "" for s in strings]


def canonical(smiles: str) -> str | None:
    """RDKit canonical SMILES, or ``None`` for an unparsable or empty molecule."""
    mol = _mol(smiles)
    return None if mol is None else Chem.MolToSmiles(mol)


@dataclass(frozen=True)
class Vocab:
    """SELFIES token vocabulary with three specials: ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2)."""

    tokens: tuple[str, ...]

    PAD, BOS, EOS = 0, 1, 2

    @classmethod
    def build(cls, selfies_strings: Sequence[str]) -> Vocab:
        """The sorted alphabet of the given SELFIES strings, after the specials."""
        alphabet = sorted(set().union(*(sf.split_selfies(s) for s in selfies_strings)))
        return cls(("<pad>", "<bos>", "<eos>", *alphabet))

    def __len__(self) -> int:
        return len(self.tokens)

    def index(self, token: str) -> int:
        """Id of a token; an unknown token is an error naming it."""
        try:
            return self.tokens.index(token)
        except ValueError:
            raise KeyError(f"token {token!r} is not in the vocabulary") from None

    def encode(self, selfies_strings: Sequence[str], max_len: int) -> np.ndarray:
        """``(N, max_len)`` int64 ids ``<bos> tokens... <eos> <pad>...``; a string too long is an error."""
        lookup = {t: i for i, t in enumerate(self.tokens)}
        out = np.full((len(selfies_strings), max_len), self.PAD, dtype=np.int64)
        for r, s in enumerate(selfies_strings):
            ids = [self.BOS, *(lookup[t] for t in sf.split_selfies(s)), self.EOS]
            if len(ids) > max_len:
                raise ValueError(f"SELFIES of {len(ids)} ids exceeds max_len={max_len}: {s[:60]}...")
            out[r, : len(ids)] = ids
        return out

    def decode(self, ids: np.ndarray) -> list[str]:
        """SELFIES strings of generated id rows (without ``<bos>``), cut at the first ``<eos>``; specials dropped."""
        out = []
        for row in np.asarray(ids):
            stop = np.flatnonzero(row == self.EOS)
            row = row[: stop[0]] if len(stop) else row
            out.append("".join(self.tokens[i] for i in row if i > self.EOS))
        return out


_PROPERTY_FNS = {"logP": Descriptors.MolLogP, "TPSA": Descriptors.TPSA, "QED": QED.qed,
                 "heavy_atoms": lambda m: m.GetNumHeavyAtoms()}


def props(smiles: Sequence[str], which: Sequence[str] = PROPERTIES) -> dict[str, np.ndarray]:
    """RDKit properties of each SMILES, NaN for an invalid or empty molecule: Crippen ``logP``
    (``Descriptors.MolLogP``), ``TPSA``, ``QED`` (the slowest) and ``heavy_atoms``; ``which`` picks a subset."""
    return score(smiles, which)[0]


def score(smiles: Sequence[str], which: Sequence[str] = PROPERTIES
          ) -> tuple[dict[str, np.ndarray], list[str | None]]:
    """Properties (as :func:`props`) and canonical SMILES (``None`` when invalid) from one RDKit parse each."""
    unknown = set(which) - set(PROPERTIES)
    if unknown:
        raise ValueError(f"unknown properties {sorted(unknown)}; use {PROPERTIES}")
    out = {k: np.full(len(smiles), np.nan) for k in which}
    canon: list[str | None] = []
    for i, s in enumerate(smiles):
        mol = _mol(s)
        canon.append(None if mol is None else Chem.MolToSmiles(mol))
        if mol is not None:
            for k in which:
                out[k][i] = _PROPERTY_FNS[k](mol)
    return out, canon


def metrics_from_canonical(canon: Sequence[str | None], reference: set[str]) -> dict[str, float]:
    """``validity`` (share not ``None``), ``uniqueness`` (distinct / valid), ``novelty`` (distinct not in
    ``reference`` / distinct) of canonical SMILES."""
    if not canon:
        raise ValueError("no generated molecules to score")
    valid = [c for c in canon if c is not None]
    distinct = set(valid)
    return {
        "validity": len(valid) / len(canon),
        "uniqueness": len(distinct) / len(valid) if valid else float("nan"),
        "novelty": len(distinct - reference) / len(distinct) if distinct else float("nan"),
    }


def generation_metrics(smiles: Sequence[str], reference: set[str]) -> dict[str, float]:
    """MOSES-style metrics of generated SMILES: ``validity`` (RDKit parses a non-empty molecule),
    ``uniqueness`` (distinct canonical / valid) and ``novelty`` (distinct valid not in ``reference``, a set of
    canonical SMILES / distinct valid)."""
    return metrics_from_canonical([canonical(s) for s in smiles], reference)
