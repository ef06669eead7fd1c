"""The paper registry ``book/papers.yml``: number, slug, title, part of the book, the library module that
implements the paper, the paper's own packages (recorded with its results), and whether full mode wants a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .paths import checkout_results, project_root, results_file

REGISTRY = Path("book") / "papers.yml"
NUMERICS = ("values", "verdicts")


@dataclass(frozen=True)
class Paper:
    """One paper of the book and where its notebook, module and results live."""

    number: str
    slug: str
    title: str
    part: str
    module: str | None = None  # e.g. "repro.papers.pogo"; None until the paper has a module
    packages: tuple[str, ...] = field(default=())  # the paper's own libraries, recorded in its results
    gpu: bool = False  # full mode wants a GPU (the cluster runner requests one)
    # What quick mode keeps between machines: "values" (every claim value inside its committed interval, or equal
    # for exact evidence) or "verdicts" (chaotic training turns a last-bit difference into another draw, so values
    # move; only the verdicts must hold). The reason goes in the comment beside the entry.
    numerics: str = "values"
    headline: str = ""  # the paper's headline claim in one line, in our words (the page's verdict box)
    cite: str = ""  # the paper's key in book/references.bib (CITATION.cff's references are generated from it)
    # Full mode's cost where no full run is committed: "estimated ..." with its basis, or "measured ..." (a committed
    # results/full/NN-slug.json is shown instead: its hardware, runtime and commit). The README's full-mode table.
    full_runtime: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "packages", tuple(self.packages))
        if self.numerics not in NUMERICS:
            raise ValueError(f"book/papers.yml: paper {self.number}: numerics must be one of {NUMERICS}, "
                             f"got {self.numerics!r}")

    @property
    def stem(self) -> str:
        return f"{self.number}-{self.slug}"

    def notebook(self, root: Path) -> Path:
        return root / "notebooks" / f"{self.stem}.ipynb"

    def results(self, root: Path, mode: str = "quick") -> Path:
        """Its results file in the checkout at ``root``: ``results/NN-slug.json`` (quick) or
        ``results/<mode>/NN-slug.json`` (:func:`repro.tools.paths.results_file`)."""
        return results_file(self.stem, mode, checkout_results(root))


def load_registry(root: Path) -> tuple[list[str], list[Paper]]:
    """Parts (in book order) and papers (in number order) from ``book/papers.yml``."""
    data = yaml.safe_load((root / REGISTRY).read_text())
    parts = list(data["parts"])
    papers = [Paper(number=str(n), **v) for n, v in sorted(data["papers"].items())]
    unknown = {p.part for p in papers} - set(parts)
    if unknown:
        raise ValueError(f"book/papers.yml: papers name parts that are not listed: {sorted(unknown)}")
    return parts, papers


def find(stem: str, root: Path | None = None) -> Paper | None:
    """The registry entry of notebook ``NN-slug`` (``None`` outside a checkout or if unknown)."""
    root = root or project_root()
    if root is None or not (root / REGISTRY).exists():
        return None
    return next((p for p in load_registry(root)[1] if p.stem == stem), None)


def _paper_list(root: Path, key: str) -> list[str]:
    """The notebook numbers listed under ``key`` in ``book/papers.yml`` (each must name a paper)."""
    data = yaml.safe_load((root / REGISTRY).read_text())
    listed = [str(n).zfill(2) for n in data.get(key) or []]
    numbers = {str(n) for n in data["papers"]}
    unknown = sorted(set(listed) - numbers)
    if unknown:
        raise ValueError(f"book/papers.yml: {key} lists papers that do not exist: {unknown}")
    return listed


def legacy_claims(root: Path) -> list[str]:
    """The numbers of the notebooks still on old-style ``Claim`` lists (``legacy_claims`` in ``book/papers.yml``)."""
    return _paper_list(root, "legacy_claims")


def figure_policy_pending(root: Path) -> list[str]:
    """The numbers of the notebooks whose figures do not yet follow :func:`repro.plotting.figure_problems`
    (``figure_policy_pending`` in ``book/papers.yml``; the fidelity issues apply the policy and shorten it)."""
    return _paper_list(root, "figure_policy_pending")

