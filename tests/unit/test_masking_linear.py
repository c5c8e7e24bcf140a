"""The log masks run in linear time on hostile lines and mean what they meant before.

A receiver takes lines from anybody who can log: one 40 KB line used to block the log detector's
event loop for 14 s in the SERIAL mask. Each mask is fed 256 KB lines shaped to make a backtracking
engine rescan (long identifier runs, dotted runs, digit runs). Nothing is timed: a linear pass
over all of them takes a few seconds here, the quadratic patterns took minutes per line, so the
test's timeout (pytest-timeout) is what fails a regression, not an assertion on a duration.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.detectors.masking import MASK_PATTERNS

N = 256 * 1024
HOSTILE = {
    "underscore-number runs": "a" + "_1111" * (N // 5) + "-",
    "many serial words": "a_1111 " * (N // 7),
    "digit run": "1" * N + "-",
    "hex run": "f" * N + "-",
    "path segments": "/" + "/a" * (N // 2) + "-",
    "dotted host": "a" + ".b" * (N // 2) + ":",
    "dashes before a slash": "a" + "-" * N + "/",
    "dotted digits": "1." * (N // 2),
    "block ids": "blk_1 " * (N // 6) + "x",
    "scheme-like run": "x." * (N // 2),
    "pci-like run": "0000:" * (N // 5),
}


@pytest.mark.timeout(60)  # a backtracking mask takes minutes on one of these lines
@pytest.mark.parametrize("mask", sorted(MASK_PATTERNS))
def test_every_mask_handles_256_kb_hostile_lines_in_bounded_time(mask: str) -> None:
    pattern = re.compile(MASK_PATTERNS[mask])
    for line in HOSTILE.values():
        pattern.sub("<X>", line)


# The patterns these replaced; the rewrites must match exactly the same spans.
_LEFT = r"(?<![\w.\-/:])"
_RIGHT = r"(?![\w\-]|[.:/]\w)"
OLD = {
    "SERIAL": rf"{_LEFT}[A-Za-z]\w*?_\d{{4,}}\w*{_RIGHT}",
    "URL": r"(?<![\w])[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s\"'<>()\[\],]+",
}
pieces = st.sampled_from(["a", "Z", "_", "1234", "_20", "7", ".", "-", "/", ":", " ", "://", "x.", "http", "é"])


@settings(max_examples=500, deadline=None)
@given(line=st.lists(pieces, max_size=30).map("".join))
def test_the_linear_rewrites_match_what_the_old_patterns_matched(line: str) -> None:
    for mask, old in OLD.items():
        new_spans = [m.span() for m in re.finditer(MASK_PATTERNS[mask], line)]
        old_spans = [m.span() for m in re.finditer(old, line)]
        if mask == "URL" and any(re.search(r"[a-zA-Z][a-zA-Z0-9+.\-]{32,}://", line[a:b]) for a, b in old_spans):
            continue  # schemes of 32+ characters are no longer URLs (none exist)
        assert new_spans == old_spans, (mask, line)


def test_known_serials_and_urls_are_still_masked() -> None:
    serial = re.compile(MASK_PATTERNS["SERIAL"])
    assert serial.sub("<S>", "attempt_1445144423722_0020_m_000000_0 started") == "<S> started"
    assert serial.sub("<S>", "DFSClient_NONMAPREDUCE_1537864556_1 wrote") == "<S> wrote"
    assert serial.sub("<S>", "layer_3 loaded") == "layer_3 loaded"
    url = re.compile(MASK_PATTERNS["URL"])
    assert url.sub("<U>", "GET https://example.org/v1/models?x=1 200") == "GET <U> 200"
