"""GrammarCompiler's default engine for JSON schemas (`auto`: llguidance) on JSONSchemaBench's
real-world schemas, no model (the default tokenizer only): a stratified sample (3 from each of
the ten folders) compiles within the server's limit, every random walk through a compiled
schema's masks that finishes is valid under `jsonschema`, and no invalid document is accepted:
each valid walk's document, mutated (a key dropped or added, a type changed, a bound, enum or
length broken, the text cut short, ...) into documents `jsonschema` rejects, is fed through the
grammar token by token and must be refused (the valid document itself, fed the same way, must
be accepted: a check that the feeding can accept at all).

The data is read from ../shared/jsonschemabench (beside the repository; skipped without it).
The walks and mutations are benchmarks/json_schema_docs.py's, which
benchmarks/json_schema_bench.py runs on 400 schemas and four engines."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from json_schema_docs import (  # noqa: E402
    SHARED_TARBALL,
    StateMatcher,
    accepts,
    closer_tokens,
    compact,
    doc_tokens,
    extract,
    invalid_documents,
    sample,
    validator_of,
    walk,
    writable,
)

from radixrt.runtime.config import DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S  # noqa: E402
from radixrt.runtime.constrained.compiler import GrammarCompiler  # noqa: E402
from radixrt.runtime.constrained.grammar_engine import mask_words  # noqa: E402
from radixrt.runtime.constrained.token_table import TokenTable  # noqa: E402

PER_FOLDER = 3
WALKS = 4  # per compiled schema
WALK_TOKENS = 96
MUTANTS = 8  # invalid documents fed per valid walk
MIN_COMPILED = 0.6  # of the sample (the benchmark's 400 measure coverage; this, that it runs)


@dataclass
class Outcome:
    """What one schema did."""

    where: str
    compile_s: float = 0.0
    refused: str = ""
    finished: int = 0
    invalid_walks: list[str] = field(default_factory=list)
    controls: int = 0
    controls_refused: list[str] = field(default_factory=list)
    mutants: int = 0
    accepted: list[tuple[str, str]] = field(default_factory=list)  # (kind, document)


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str, str]]:
    if not os.path.isfile(SHARED_TARBALL):
        pytest.skip(f"no JSONSchemaBench data: {os.path.normpath(SHARED_TARBALL)} is absent")
    data = extract(SHARED_TARBALL, str(tmp_path_factory.mktemp("jsonschemabench")))
    assert data is not None
    return sample(data, PER_FOLDER)


@pytest.fixture(scope="module")
def compiler() -> Iterator[GrammarCompiler]:
    from radixrt.runtime.models.loader import load_tokenizer

    tok = load_tokenizer("default")
    compiler = GrammarCompiler(TokenTable(tok, len(tok), [tok.eos_token_id]),
                               timeout_s=DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S)
    yield compiler
    compiler.close()


def run_schema(compiler: GrammarCompiler, where: str, schema_text: str, seed: int,
               closers: np.ndarray) -> Outcome:
    table = compiler.table
    eos = table.eos_token_id
    words = torch.zeros(mask_words(table.vocab_size), dtype=torch.int32)
    out = Outcome(where)
    start = time.perf_counter()
    try:
        grammar = compiler.get(("json_schema", schema_text))
    except ValueError as exc:  # refused by name, or GrammarTimeout
        out.refused = str(exc)
        return out
    finally:
        out.compile_s = time.perf_counter() - start
    rng = random.Random(seed)
    valid = validator_of(schema_text)
    docs: list[Any] = []
    for _ in range(WALKS):
        tokens = walk(StateMatcher(grammar.new_state()), words, eos, rng, WALK_TOKENS,
                      closers)
        if tokens is None:
            continue
        out.finished += 1
        text = b"".join(table.token_bytes[t] or b"" for t in tokens).decode("utf-8", "replace")
        try:
            doc = json.loads(text)
        except ValueError:
            out.invalid_walks.append(text)
            continue
        verdict = valid(doc)
        if verdict is False:
            out.invalid_walks.append(text)
        elif verdict:
            docs.append(doc)
    for doc in filter(writable, docs):  # not one with a number past the largest float
        tokens = doc_tokens(compact(doc), table.encode, table.token_bytes)
        if tokens is not None:
            out.controls += 1
            if not accepts(StateMatcher(grammar.new_state()), tokens, words, eos):
                out.controls_refused.append(compact(doc).decode())
        for kind, text in invalid_documents(doc, valid, MUTANTS, rng):
            tokens = doc_tokens(text, table.encode, table.token_bytes)
            if tokens is None:
                continue
            out.mutants += 1
            if accepts(StateMatcher(grammar.new_state()), tokens, words, eos):
                out.accepted.append((kind, text.decode()))
    return out


@pytest.fixture(scope="module")
def outcomes(compiler: GrammarCompiler, schemas: list[tuple[str, str, str]]) -> list[Outcome]:
    closers = closer_tokens(compiler.table.token_bytes)
    return [run_schema(compiler, f"{folder}/{name}", text, seed, closers)
            for seed, (folder, name, text) in enumerate(schemas)]


def test_the_sample_compiles_within_the_limit(outcomes: list[Outcome]) -> None:
    slow = [(o.where, round(o.compile_s, 1)) for o in outcomes
            if o.compile_s >= DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S or "time" in o.refused.lower()]
    assert not slow, f"compiles past {DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S} s: {slow}"
    compiled = [o for o in outcomes if not o.refused]
    assert len(compiled) >= MIN_COMPILED * len(outcomes), [(o.where, o.refused[:120])
                                                           for o in outcomes if o.refused]


def test_every_refusal_names_its_reason(outcomes: list[Outcome]) -> None:
    for o in outcomes:
        if o.refused:
            assert o.refused.startswith("json_schema "), (o.where, o.refused)


def test_finished_walks_are_valid(outcomes: list[Outcome]) -> None:
    invalid = [(o.where, text[:200]) for o in outcomes for text in o.invalid_walks]
    assert not invalid, invalid
    assert sum(o.finished for o in outcomes) >= len(outcomes)  # walks do finish


def test_valid_documents_fed_back_are_accepted(outcomes: list[Outcome]) -> None:
    refused = [(o.where, text[:200]) for o in outcomes for text in o.controls_refused]
    assert not refused, refused
    assert sum(o.controls for o in outcomes) >= 10


def test_no_invalid_document_is_accepted(outcomes: list[Outcome]) -> None:
    accepted = [(o.where, kind, text[:200]) for o in outcomes for kind, text in o.accepted]
    assert not accepted, accepted
    assert sum(o.mutants for o in outcomes) >= 100  # mutants were fed, not just made
