"""Constraints as outlines-core regexes: where the end marker is appended and where a pattern
is indexed as it is, and broken patterns named in Python's words where Python refuses them."""

from __future__ import annotations

import pytest
from outlines_core import Vocabulary

from radixrt.runtime.constrained.outlines_regex import plan_regex, validate_regex

BYTES = Vocabulary(256, {bytes([b]): [b] for b in range(256)})


@pytest.mark.parametrize(("regex", "marked"), [
    ("yes|no", True), ("a.*b", True), ("yes$", False), ("yes\\z", False),
    ("(?x)abc # a comment", False)])
def test_the_marker_follows_every_pattern_it_can(regex: str, marked: bool) -> None:
    planned, was_marked = plan_regex(("regex", regex), BYTES, has_marker=True)
    assert was_marked is marked
    assert planned.endswith("\\x00") is marked
    assert plan_regex(("regex", regex), BYTES, has_marker=False) == (regex, False)


@pytest.mark.parametrize(("regex", "fragment"), [
    ("(ab", "is invalid: missing ), unterminated subpattern"),
    ("(?=a)a", "cannot be compiled"),  # Python's re takes it, outlines-core does not
])
def test_broken_patterns_are_named(regex: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", "\\(").replace(")", "\\)")):
        validate_regex(("regex", regex), BYTES)
