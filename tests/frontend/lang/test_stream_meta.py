"""The meta info of a gen's pieces (`text_async_iter(name, return_meta_data=True)`, SGLang's
contract of test_stream_logprobs) and return_text_in_logprobs' token texts: on their own, then
through programs on an in-memory streaming backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import radixrt as rx
from radixrt.frontend.lang.backend import PieceMeta
from radixrt.frontend.lang.stream_meta import GenStream, with_token_texts


def entry(token_id: int) -> tuple[float, int, None]:
    return (-0.1 * token_id, token_id, None)


def test_entries_of_pieces_without_text_go_with_the_next_piece():
    stream = GenStream(logprobs=True)
    first = stream.piece("He", PieceMeta(1, {"output_token_logprobs": [entry(1)]}))
    held = stream.piece("", PieceMeta(1, {"output_token_logprobs": [entry(2)]}))
    second = stream.piece("llo", PieceMeta(1, {"output_token_logprobs": [entry(3)]}))
    assert first == {"completion_tokens": 1, "output_token_logprobs": [entry(1)],
                     "output_top_logprobs": [], "output_token_logprobs_length": 1}
    assert held is None
    assert second is not None and second["output_token_logprobs"] == [entry(2), entry(3)]
    assert second["completion_tokens"] == second["output_token_logprobs_length"] == 3
    last = stream.last({"finish_reason": "stop", "completion_tokens": 4,
                        "output_token_logprobs": [entry(i) for i in (1, 2, 3, 4)]})
    assert last["output_token_logprobs"] == [entry(4)]
    assert last["output_token_logprobs_length"] == last["completion_tokens"] == 4
    assert last["finish_reason"] == "stop"

    plain = GenStream(logprobs=False)
    assert plain.piece("x", PieceMeta(2)) == {"completion_tokens": 2}
    assert plain.piece("y", None) == {}  # a backend that does not count: no count


def test_token_texts_fill_only_what_the_backend_left_out():
    meta = {"output_token_logprobs": [(-0.5, 7, None), (-0.2, None, "b")],
            "output_top_logprobs": [[(-0.5, 7, None), (-1.0, 8, None)], []],
            "input_token_logprobs": [(None, 9, None)], "completion_tokens": 2}
    asked: list[list[int]] = []

    def decode(ids: Any) -> list[str]:
        asked.append(list(ids))
        return [f"<{i}>" for i in ids]

    out = with_token_texts(meta, decode)
    assert asked == [[7, 8, 9]]  # each id once, in one call
    assert out["output_token_logprobs"] == [(-0.5, 7, "<7>"), (-0.2, None, "b")]
    assert out["output_top_logprobs"] == [[(-0.5, 7, "<7>"), (-1.0, 8, "<8>")], []]
    assert out["input_token_logprobs"] == [(None, 9, "<9>")]
    assert with_token_texts({"completion_tokens": 2}, None) == {"completion_tokens": 2}
    with pytest.raises(rx.BackendError, match="return_text_in_logprobs"):
        with_token_texts(meta, None)


class Streaming:
    """Streams "Hel" "" "lo" (the empty piece holds a token, as a half character would), each
    token with a logprob entry when asked; decodes id i as "t<i>"."""

    def chat_format(self) -> rx.ChatFormat:
        return rx.ChatFormat({})

    def generate(self, text: str, params: dict[str, Any], on_piece: Any,
                 priority: int = 0) -> rx.GenResult:
        wanted = bool(params.get("logprobs"))
        entries = [(-0.5, i, None) for i in (1, 2, 3)]
        if on_piece is not None:
            for piece, i in (("Hel", 0), ("", 1), ("lo", 2)):
                on_piece(piece, PieceMeta(1, {"output_token_logprobs": [entries[i]]}
                                          if wanted else {}))
        logprobs = {"output_token_logprobs": entries} if wanted else {}
        return rx.GenResult("Hello", "stop", 4, 0, 3, logprobs)

    def token_texts(self, ids: list[int]) -> list[str]:
        return [f"t{i}" for i in ids]

    def score(self, *args: Any, **kwargs: Any) -> list[rx.ChoiceLogprobs]:
        return []

    def pin(self, text: str, priority: int = 0) -> None:
        return None

    def unpin(self, handle: Any) -> None:
        return None

    def info(self) -> dict[str, Any]:
        return {}


@rx.function
def qa(s):
    s += "Q: hi\nA:" + rx.gen("answer", return_logprob=True)


def collect(state: rx.ProgramState, name: str | None) -> list[tuple[str, dict[str, Any]]]:
    async def main() -> list[tuple[str, dict[str, Any]]]:
        return [chunk async for chunk in state.text_async_iter(name, return_meta_data=True)]
    return asyncio.run(main())


def test_text_async_iter_gives_sglangs_streamed_meta_info():
    chunks = collect(qa.run(backend=Streaming(), stream=True), "answer")
    assert [text for text, _ in chunks] == ["Hel", "lo"]
    before = 0
    for _, meta in chunks:  # SGLang's test_stream_logprobs checks, piece by piece
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - before
        before = meta["completion_tokens"]
    assert before == 3

    whole = collect(qa.run(backend=Streaming()), None)  # not streamed: one piece a gen
    assert whole[0] == ("Q: hi\nA:", {})
    text, meta = whole[1]
    assert text == "Hello" and meta["output_token_logprobs_length"] == 3
    assert meta["finish_reason"] == "stop" and len(meta["output_token_logprobs"]) == 3

    async def plain() -> list[str]:
        state = qa.run(backend=Streaming(), stream=True)
        return [piece async for piece in state.text_async_iter("answer")]
    assert asyncio.run(plain()) == ["Hel", "lo"]


def test_return_text_in_logprobs_decodes_with_the_backends_tokenizer():
    @rx.function
    def texts(s):
        s += "Q:" + rx.gen("a", return_logprob=True, return_text_in_logprobs=True)
        s += rx.gen("b", return_logprob=True)

    state = texts.run(backend=Streaming())
    assert [e[2] for e in state.get_meta_info("a")["output_token_logprobs"]] == ["t1", "t2", "t3"]
    assert state.get_meta_info("b")["output_token_logprobs"][0][2] is None
    ran = texts.run(backend=Streaming(), return_text_in_logprobs=True)  # a run's default
    assert ran.get_meta_info("b")["output_token_logprobs"][0][2] == "t1"
    chunks = collect(texts.run(backend=Streaming(), stream=True), "a")
    assert [e[2] for _, meta in chunks for e in meta["output_token_logprobs"]] == \
        ["t1", "t2", "t3"]
    with pytest.raises(TypeError, match="return_text_in_logprobs must be a bool"):
        rx.gen("x", return_text_in_logprobs="yes")
