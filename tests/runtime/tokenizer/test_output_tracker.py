"""OutputTracker folding OutputDelta messages into a RequestOutput and StreamChunks: samples by
index, index -1 ending every sample, finish reasons, stop strings (trimmed, reported as stopped),
logprobs, cached tokens and prompt logprobs; the streamed chunks add up to the final output.
The tokenizer is a small byte-level BPE trained in memory (multi-byte characters span tokens)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from toy_tokenizers import byte_level_bpe
from transformers import PreTrainedTokenizerFast

from radixrt.runtime.messages import OutputDelta, TokenLogprob
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.output_tracker import OutputTracker

CORPUS = [
    "Hello world, the quick brown fox jumps over the lazy dog.",
    "The END of the story is near; the end is not the END.",
    "naïve café, crème brûlée, déjà vu",
    "JSON: {\"name\": \"Ada\", \"age\": 36}",
] * 4
RID = 7


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return byte_level_bpe(CORPUS, vocab_size=320)


def encode(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def delta(index: int = 0, token_ids: Sequence[int] = (), finish: str | None = None,
          **fields: Any) -> OutputDelta:
    return OutputDelta(rid=RID, owner=RID, index=index, token_ids=list(token_ids),
                       finish_reason=finish, **fields)


def feed(tracker: OutputTracker, deltas: Sequence[OutputDelta]) -> tuple[list[StreamChunk],
                                                                         list[bool]]:
    chunks: list[StreamChunk] = []
    stopped: list[bool] = []
    for d in deltas:
        new, stop = tracker.apply(d)
        chunks += new
        stopped.append(stop)
    return chunks, stopped


def one_by_one(ids: Sequence[int], finish: str | None = "length",
               index: int = 0) -> list[OutputDelta]:
    return [delta(index, [t], finish if i == len(ids) - 1 else None) for i, t in enumerate(ids)]


def tracker_for(tok: Any, prompt: str = "Hello", **params: Any) -> OutputTracker:
    return OutputTracker(tok, RID, encode(tok, prompt), SamplingParams(**params))


def test_the_tokenizer_splits_characters_across_tokens(tok: Any) -> None:
    ids = encode(tok, "😀")  # never seen in training: its four bytes are four tokens
    assert len(ids) == 4 and tok.decode(ids[:2]).endswith("\ufffd")


# --- one sample --------------------------------------------------------------------------------


def test_stream_of_one_sample_adds_up_to_the_output(tok: Any) -> None:
    text = "the quick brown fox 😀 jumps, naïve café"
    ids = encode(tok, text)
    tracker = tracker_for(tok, "Hello world,", max_tokens=len(ids))
    chunks = []
    for d in one_by_one(ids):
        assert not tracker.finished
        new, stopped = tracker.apply(d)
        assert len(new) == 1 and not stopped
        chunks += new
    out = tracker.output
    assert tracker.finished and out.finish_reason == "length"
    assert out.text == text == "".join(c.text for c in chunks)
    assert out.token_ids == ids == [t for c in chunks for t in c.token_ids]
    assert all("\ufffd" not in c.text for c in chunks)  # a character is sent whole
    assert [c.finish_reason for c in chunks] == [None] * (len(ids) - 1) + ["length"]
    assert {(c.rid, c.index) for c in chunks} == {(RID, 0)}
    assert out.rid == RID and out.prompt_token_ids == encode(tok, "Hello world,")
    assert out.completion_tokens == len(ids)


def test_deltas_of_several_tokens(tok: Any) -> None:
    text = "déjà vu, crème brûlée"
    ids = encode(tok, text)
    tracker = tracker_for(tok)
    pieces = [ids[:3], ids[3:4], [], ids[4:]]
    chunks, _ = feed(tracker, [delta(0, p) for p in pieces] + [delta(0, [], "stop")])
    assert "".join(c.text for c in chunks) == text == tracker.output.text
    assert tracker.output.finish_reason == "stop"


@pytest.mark.parametrize("reason", ["length", "stop", "abort", "error: the worker failed"])
def test_finish_reasons_are_kept(tok: Any, reason: str) -> None:
    tracker = tracker_for(tok)
    chunks, stopped = feed(tracker, [delta(0, encode(tok, "the end"), reason)])
    assert tracker.output.finish_reason == reason == chunks[-1].finish_reason
    assert stopped == [False] and tracker.finished


def test_finish_flushes_text_held_back(tok: Any) -> None:
    ids = encode(tok, "fox 😀")
    tracker = tracker_for(tok)
    chunks, _ = feed(tracker, [delta(0, ids[:-1])])  # the emoji's last byte is missing
    assert [c.text for c in chunks] == [""] and tracker.output.text == ""  # held back whole
    chunks, _ = feed(tracker, [delta(0, [], "abort")])
    assert chunks[0].text == "fox \ufffd"  # what there is of it, once nothing more comes
    assert tracker.output.text == "fox \ufffd" and tracker.output.token_ids == ids[:-1]


def test_special_tokens_are_skipped_unless_asked(tok: Any) -> None:
    ids = encode(tok, "the end") + [tok.eos_token_id]
    skipped = tracker_for(tok)
    feed(skipped, [delta(0, ids, "stop")])
    assert skipped.output.text == "the end" and skipped.output.token_ids == ids
    kept = tracker_for(tok, skip_special_tokens=False)
    feed(kept, [delta(0, ids, "stop")])
    assert kept.output.text == "the end<eos>"


# --- stop strings ------------------------------------------------------------------------------


def test_a_stop_string_trims_the_text_and_is_reported(tok: Any) -> None:
    ids = encode(tok, "The END of the story")
    tracker = tracker_for(tok, stop="END")
    results = [tracker.apply(d) for d in one_by_one(ids, finish=None)]
    chunks = [c for new, _ in results for c in new]
    stopped = [s for _, s in results]
    assert stopped.count(True) == 1  # the caller ends the request on the scheduler side here
    end = stopped.index(True)
    assert all(new == [] for new, _ in results[end + 1:])  # later tokens are ignored
    out = tracker.output
    assert out.text == "The " == "".join(c.text for c in chunks)
    assert out.finish_reason == "stop" and chunks[-1].finish_reason == "stop"
    assert tracker.finished
    assert out.token_ids == ids[: end + 1] == [t for c in chunks for t in c.token_ids]
    # the scheduler's own end of the request afterwards changes nothing
    assert tracker.apply(delta(0, [], "stop")) == ([], False)
    assert tracker.apply(delta(0, [], "abort")) == ([], False)
    assert out.finish_reason == "stop" and out.text == "The "


def test_a_possible_stop_string_is_held_back_until_it_is_not(tok: Any) -> None:
    tracker = tracker_for(tok, stop=["END!"])
    chunks, stopped = feed(tracker, [delta(0, encode(tok, "the EN")),
                                     delta(0, encode(tok, "D")),
                                     delta(0, encode(tok, " end"))])
    assert [c.text for c in chunks] == ["the ", "", "END end"]  # "END" might have been "END!"
    assert stopped == [False] * 3 and not tracker.finished
    chunks, _ = feed(tracker, [delta(0, encode(tok, " EN"), "length")])
    assert chunks[0].text == " EN"  # released at the end
    assert tracker.output.text == "the END end EN" and tracker.output.finish_reason == "length"


def test_the_first_completed_stop_string_wins(tok: Any) -> None:
    tracker = tracker_for(tok, stop=["fox jumps", "brown"])
    feed(tracker, one_by_one(encode(tok, "quick brown fox jumps"), finish=None))
    assert tracker.output.text == "quick " and tracker.output.finish_reason == "stop"


def test_a_stop_string_in_the_last_delta_is_not_reported_as_stopped_here(tok: Any) -> None:
    tracker = tracker_for(tok, stop="END")
    _, stopped = feed(tracker, [delta(0, encode(tok, "the END is near"), "length")])
    assert stopped == [False]  # the scheduler ended it already
    assert tracker.output.finish_reason == "stop" and tracker.output.text == "the "


def test_stop_strings_in_a_jump_forward_delta(tok: Any) -> None:
    ids = encode(tok, 'JSON: {"name": "Ada"}')
    tracker = tracker_for(tok, stop='"Ada')
    chunks, stopped = feed(tracker, [delta(0, ids[:2]), delta(0, ids[2:])])
    assert stopped == [False, True]
    assert tracker.output.text == 'JSON: {"name": ' == "".join(c.text for c in chunks)


# --- n > 1 -------------------------------------------------------------------------------------


def test_samples_are_kept_apart_by_index(tok: Any) -> None:
    texts = ["the quick fox", "naïve café", "the END"]
    ids = [encode(tok, t) for t in texts]
    tracker = tracker_for(tok, n=3, stop="END")
    streams: dict[int, list[StreamChunk]] = {0: [], 1: [], 2: []}
    order = [(i, j) for j in range(max(map(len, ids))) for i in (2, 0, 1) if j < len(ids[i])]
    stopped_at = []
    for i, j in order:
        last = j == len(ids[i]) - 1
        new, stopped = tracker.apply(delta(i, [ids[i][j]], "length" if last and i != 2 else None))
        for c in new:
            assert c.index == i
            streams[i].append(c)
        if stopped:
            stopped_at.append(i)
    out = tracker.output
    assert stopped_at == [2]
    assert [s.index for s in out.samples] == [0, 1, 2]
    assert [s.text for s in out.samples] == ["the quick fox", "naïve café", "the "]
    assert [s.finish_reason for s in out.samples] == ["length", "length", "stop"]
    for i, sample in enumerate(out.samples):
        assert "".join(c.text for c in streams[i]) == sample.text
        assert [t for c in streams[i] for t in c.token_ids] == sample.token_ids
    assert out.text == out.samples[0].text and out.completion_tokens == sum(
        len(s.token_ids) for s in out.samples)
    assert tracker.finished


def test_not_finished_until_every_sample_is(tok: Any) -> None:
    tracker = tracker_for(tok, n=2)
    feed(tracker, [delta(1, encode(tok, "the end"), "length")])
    assert not tracker.finished and tracker.output.samples[0].finish_reason is None
    feed(tracker, [delta(0, encode(tok, "fox"), "length")])
    assert tracker.finished


def test_index_minus_one_ends_every_sample_still_going(tok: Any) -> None:
    tracker = tracker_for(tok, n=3)
    feed(tracker, [delta(1, encode(tok, "the end"), "length")])
    chunks, stopped = feed(tracker, [delta(-1, [], "abort")])
    assert stopped == [False]
    assert [(c.index, c.text, c.token_ids, c.finish_reason) for c in chunks] == [
        (0, "", [], "abort"), (2, "", [], "abort")]
    assert [s.finish_reason for s in tracker.output.samples] == ["abort", "length", "abort"]
    assert tracker.output.samples[1].text == "the end"
    assert tracker.finished
    assert feed(tracker, [delta(-1, [], "abort")])[0] == []  # nothing left to end


def test_index_minus_one_ends_a_single_sample_request(tok: Any) -> None:
    tracker = tracker_for(tok)
    chunks, _ = feed(tracker, [delta(-1, [], "error: the grammar failed to compile")])
    assert [(c.index, c.finish_reason) for c in chunks] == [
        (0, "error: the grammar failed to compile")]
    assert tracker.finished and tracker.output.text == ""


# --- logprobs, cached tokens, prompt logprobs --------------------------------------------------


def test_logprobs_follow_the_tokens(tok: Any) -> None:
    ids = encode(tok, "the quick fox")
    lps = [TokenLogprob(token_id=t, logprob=-0.5 * k, top=[(t, -0.5 * k)])
           for k, t in enumerate(ids)]
    tracker = tracker_for(tok, logprobs=True, top_logprobs=1)
    chunks, _ = feed(tracker, [delta(0, ids[:2], logprobs=lps[:2]),
                               delta(0, ids[2:], "length", logprobs=lps[2:])])
    assert tracker.output.logprobs == lps
    assert [c.logprobs for c in chunks] == [lps[:2], lps[2:]]


def test_cached_tokens_and_prompt_logprobs(tok: Any) -> None:
    prompt_lps = [TokenLogprob(token_id=5, logprob=-1.0), TokenLogprob(token_id=6, logprob=-2.0)]
    tracker = tracker_for(tok)
    ids = encode(tok, "the end")
    chunks, _ = feed(tracker, [delta(0, ids[:1], cached_tokens=3, prompt_logprobs=prompt_lps),
                               delta(0, ids[1:], "length", cached_tokens=3)])
    out = tracker.output
    assert out.cached_tokens == 3 and [c.cached_tokens for c in chunks] == [3, 3]
    assert out.prompt_logprobs == prompt_lps  # not cleared by the deltas without them
    assert [c.prompt_logprobs for c in chunks] == [prompt_lps, []]


def test_the_prompt_is_left_context_only(tok: Any) -> None:
    ids = encode(tok, " brown fox")
    for prompt in ["", "the quick", "naïve café 😀"]:
        tracker = OutputTracker(tok, RID, encode(tok, prompt), SamplingParams())
        chunks, _ = feed(tracker, one_by_one(ids))
        assert tracker.output.text == " brown fox" == "".join(c.text for c in chunks)


# --- property: any split into deltas gives the same output -------------------------------------

WORDS = ["the", " END", " fox", " café", " 😀", "é", " brown", ",", " déjà", "D", " E"]


def expected_text(full: str, stops: Sequence[str]) -> str:
    """full cut before the stop string completed first (earliest end, the longest on a tie)."""
    hits = [(full.find(s) + len(s), -len(s), full.find(s)) for s in stops if s in full]
    return full[: min(hits)[2]] if hits else full


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=12),
       sizes=st.lists(st.integers(0, 4), min_size=1, max_size=30),
       stops=st.lists(st.sampled_from(["END", "fox c", "é 😀", "D E", "xyz", "é"]), max_size=2),
       end_reason=st.sampled_from(["length", "stop", "abort"]))
def test_any_split_into_deltas_streams_the_final_output(
        tok: Any, words: list[str], sizes: list[int], stops: list[str], end_reason: str) -> None:
    full = "".join(words)
    ids = encode(tok, full)
    assert tok.decode(ids) == full
    tracker = tracker_for(tok, stop=stops)
    deltas, pos, k = [], 0, 0
    while pos < len(ids):
        n = sizes[k % len(sizes)]
        k += 1
        if n == 0:  # a delta without tokens (a step that only reports), then one token
            deltas.append(delta(0, []))
            n = 1
        deltas.append(delta(0, ids[pos:pos + n]))
        pos += n
    deltas.append(delta(0, [], end_reason))
    chunks, stopped = feed(tracker, deltas)
    out = tracker.output
    want = expected_text(full, stops)
    assert out.text == want == "".join(c.text for c in chunks)
    assert out.token_ids == [t for c in chunks for t in c.token_ids]
    assert all("\ufffd" not in c.text for c in chunks)
    assert tracker.finished and chunks[-1].finish_reason == out.finish_reason
    assert sum(c.finish_reason is not None for c in chunks) == 1
    hit = any(s in full for s in stops)
    assert out.finish_reason == ("stop" if hit else end_reason)
    assert stopped.count(True) == (1 if hit else 0)
    assert not stopped[-1]  # the end delta itself is never "stopped here"
