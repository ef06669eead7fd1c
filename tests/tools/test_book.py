"""repro.tools.book: the results page's overview (verdict bars counted from the claims) and the README table."""

from __future__ import annotations

import re

from repro.report import Claim
from repro.tools import book


def _record(*claims):
    from dataclasses import asdict

    return {"claims": [asdict(c) for c in claims], "mode": "quick", "seed": 0}


def test_verdict_bar_has_one_block_per_claim_in_verdict_order():
    rec = _record(Claim("C1", "a", paper=1, measured=1, hi=2), Claim("C2", "b", paper=1, measured=3, hi=2),
                  Claim("C3", "c", paper=1, measured=1, hi=2, analogue=True),
                  Claim("C4", "d", paper=1, measured=1, hi=2, analogue=True),
                  Claim("K1", "e", paper="ref", measured=0, hi=0, kind="check"))
    bar = book.verdict_bar(rec)
    segments = re.findall(r'title="(\d+) ([^"]+)" style="[^"]*width:(\d+)px', bar)
    u = book.BAR_UNIT_PX
    assert segments == [("1", "Re", f"{u}"), ("2", "~Re", f"{2 * u}"), ("1", "not Re", f"{u}"), ("1", "pass", f"{u}")]
    assert book.verdict_counts(rec) == "1 Re, 2 ~Re, 1 not Re" and book.check_counts(rec) == "1 of 1 pass"
    assert book.verdict_bar(None) == "" and book.check_counts(_record(Claim("C1", "a", paper=1, measured=1, hi=2))) \
        == "none"
