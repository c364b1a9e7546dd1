"""Placing DSL programs on replicas, as pure logic (no runtime): the approximate prefix tree
against a naive model of it, and the SGLang router's cache_aware rule (decide, ReplicaChooser):
a cached prefix draws its programs unless the loads are out of balance by the rule, and
unrelated prefixes spread evenly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixrt.frontend.backends.prefix_tree import PrefixTree
from radixrt.frontend.backends.replica_choice import (
    BALANCE,
    CACHE,
    CAPACITY,
    REPLICA_BALANCE_ABS_THRESHOLD,
    REPLICA_BALANCE_REL_THRESHOLD,
    REPLICA_CACHE_THRESHOLD,
    ChoiceRule,
    NoReplicaUp,
    ReplicaChooser,
    decide,
)

texts = st.text(alphabet="abc", max_size=12)  # a small alphabet: texts share prefixes often
UNRELATED = [chr(ord("A") + i) + "-" * 20 for i in range(26)]  # no two share a first character


def naive_match(stored: list[str], text: str) -> int:
    best = 0
    for s in stored:
        n = 0
        while n < min(len(s), len(text)) and s[n] == text[n]:
            n += 1
        best = max(best, n)
    return best


def distinct_prefixes(stored: list[str]) -> int:
    """The characters a trie of these strings holds: one per distinct non-empty prefix."""
    return len({s[:i] for s in stored for i in range(1, len(s) + 1)})


# --- the prefix tree ---------------------------------------------------------------------------
@given(st.lists(texts, max_size=12), st.lists(texts, max_size=6))
def test_tree_matches_and_sizes_as_a_naive_list_of_texts(stored, probes):
    tree = PrefixTree()
    for text in stored:
        tree.insert(text)
        tree.check()
    assert tree.chars == distinct_prefixes(stored)
    for probe in probes + stored:
        assert tree.match(probe) == naive_match(stored, probe)


@given(st.lists(texts, min_size=1, max_size=12), st.integers(0, 40), st.lists(texts, max_size=6))
def test_eviction_bounds_the_tree_and_only_forgets(stored, limit, probes):
    tree = PrefixTree()
    for text in stored:
        tree.insert(text)
    before = {p: tree.match(p) for p in probes + stored}
    dropped = tree.evict(limit)
    tree.check()
    assert tree.chars <= limit and dropped == distinct_prefixes(stored) - tree.chars
    for probe, matched in before.items():
        assert tree.match(probe) <= matched


def test_eviction_drops_the_least_recently_inserted_first():
    tree = PrefixTree()
    old, new = "old text here", "new text there"
    tree.insert(old)
    tree.insert(new)
    tree.insert(old[:3])  # touches the first three characters of `old` only
    tree.evict(len(new) + 3)
    assert tree.match(new) == len(new) and tree.match(old) == 3


# --- the rule ----------------------------------------------------------------------------------
def test_the_defaults_are_the_routers():
    rule = ChoiceRule()
    assert (rule.cache_threshold, rule.balance_abs_threshold, rule.balance_rel_threshold) == (
        REPLICA_CACHE_THRESHOLD, REPLICA_BALANCE_ABS_THRESHOLD, REPLICA_BALANCE_REL_THRESHOLD)
    assert (REPLICA_CACHE_THRESHOLD, REPLICA_BALANCE_ABS_THRESHOLD,
            REPLICA_BALANCE_REL_THRESHOLD) == (0.3, 64, 1.5)
    assert rule.imbalanced([65, 0]) and not rule.imbalanced([64, 0])  # abs: strictly more
    assert not rule.imbalanced([150, 100]) and rule.imbalanced([166, 100])  # and rel, both


@pytest.mark.parametrize("bad", [dict(cache_threshold=1.5), dict(balance_abs_threshold=-1),
                                 dict(balance_rel_threshold=0.5), dict(max_tree_chars=-1)])
def test_bad_rules_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ChoiceRule(**bad)


replicas = st.integers(1, 4)


@st.composite
def situations(draw):
    """(text length, matched, loads, tree sizes, up) for 1..4 replicas, at least one up."""
    n = draw(replicas)
    text_len = draw(st.integers(0, 200))
    matched = draw(st.lists(st.integers(0, text_len), min_size=n, max_size=n))
    loads = draw(st.lists(st.integers(0, 200), min_size=n, max_size=n))
    trees = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
    up = draw(st.lists(st.booleans(), min_size=n, max_size=n).filter(any))
    return text_len, matched, loads, trees, up


@given(situations())
def test_decide_follows_the_routers_three_steps_among_the_replicas_up(situation):
    text_len, matched, loads, trees, up = situation
    rule = ChoiceRule()
    choice = decide(rule, text_len, matched, loads, trees, up)
    i = choice.replica
    live = [j for j in range(len(loads)) if up[j]]
    assert i in live
    if rule.imbalanced([loads[j] for j in live]):
        assert choice.reason == BALANCE and loads[i] == min(loads[j] for j in live)
    elif text_len and max(matched[j] for j in live) / text_len > rule.cache_threshold:
        assert choice.reason == CACHE and matched[i] == max(matched[j] for j in live)
        assert loads[i] == min(loads[j] for j in live if matched[j] == matched[i])
    else:
        assert choice.reason == CAPACITY and trees[i] == min(trees[j] for j in live)
    assert choice.match_ratio == (matched[i] / text_len if text_len else 0.0)
    with pytest.raises(NoReplicaUp):
        decide(rule, text_len, matched, loads, trees, [False] * len(loads))


# --- the chooser: trees and loads together -----------------------------------------------------
@given(st.integers(2, 4), st.text(alphabet="xyz", min_size=20, max_size=60),
       st.lists(st.text(alphabet="xyz", max_size=8), min_size=1, max_size=8),
       st.integers(0, 150))
def test_a_cached_prefix_draws_its_programs_unless_the_loads_are_out_of_balance(
        n, prefix, suffixes, busy):
    """A prefix placed on a replica draws every program that starts with it (the prefix is more
    than the threshold of each program's text), until that replica has so many calls in flight
    that the rule calls it imbalanced: then the least loaded replica."""
    chooser = ReplicaChooser(n)
    home = chooser.choose(prefix).replica
    chooser.finished(home)
    for _ in range(busy):  # calls of programs already placed there, still running
        chooser.started(home, prefix)
    for suffix in suffixes:
        loads = chooser.snapshot()["in_flight"]
        choice = chooser.choose(prefix + suffix)
        if chooser.rule.imbalanced(loads):
            assert choice.reason == BALANCE and loads[choice.replica] == min(loads)
        else:
            assert choice.replica == home and choice.reason == CACHE
        chooser.finished(choice.replica)


@given(st.integers(2, 4), st.integers(1, 26), st.booleans())
def test_unrelated_prefixes_spread_evenly(n, count, keep_running):
    """Programs with nothing in common go to the replica with the smallest tree, ties by load:
    equal-sized unrelated texts are dealt out in turn, so placements and in-flight calls never
    differ by more than one between replicas."""
    chooser = ReplicaChooser(n)
    for text in UNRELATED[:count]:
        choice = chooser.choose(text)
        assert choice.reason == CAPACITY and choice.match_ratio == 0.0
        if not keep_running:
            chooser.finished(choice.replica)
        state = chooser.snapshot()
        assert max(state["placed"]) - min(state["placed"]) <= 1
        assert max(state["in_flight"]) - min(state["in_flight"]) <= 1
        assert max(state["tree_chars"]) - min(state["tree_chars"]) <= len(text)


def test_a_program_records_what_it_generated_and_a_flush_forgets_everything():
    chooser = ReplicaChooser(2)
    first = chooser.choose("The story so far").replica
    chooser.finished(first)
    chooser.record(first, "The story so far, and what the model wrote next")
    assert chooser.choose("The story so far, and what the model wrote next. More").replica == first
    chooser.finished(first)
    chooser.forget()
    assert chooser.snapshot()["tree_chars"] == [0, 0]
    with pytest.raises(RuntimeError, match="without a call in flight"):
        chooser.finished(0)


def test_a_replica_marked_down_draws_nothing_even_its_own_prefix():
    chooser = ReplicaChooser(2)
    home = chooser.choose("A long shared few-shot prefix").replica
    chooser.finished(home)
    chooser.mark_down(home)
    assert chooser.choose("A long shared few-shot prefix, and a question").replica == 1 - home
    assert chooser.snapshot()["up"][home] == 0
