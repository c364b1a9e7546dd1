"""The llguidance engine (PyPI `llguidance`, CPU only): an Earley parser over a lazy lexer
that computes each step's mask from a token trie, so compiling is milliseconds where
outlines-core indexes a whole DFA, and context-free grammars work.

Every kind becomes an llguidance grammar: regexes and choices as a regex, JSON schemas through
its JSON-schema compiler (compact JSON, as the outlines-core path writes it; a keyword it cannot
enforce is refused by name), GBNF (llama.cpp's syntax) through its converter to Lark, Lark as
it is, tool calls and reasoning as Lark (structural_lark.py). The vocabulary is the TokenTable's
bytes, so any tokenizer radixrt loads works."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import torch
from llguidance import LLMatcher, LLTokenizer
from llguidance.gbnf_to_lark import gbnf_to_lark

from radixrt.runtime.constrained.grammar_engine import (
    Constraint,
    Grammar,
    GrammarEngine,
    GrammarState,
    clear_tokens,
    store_path,
    write_atomically,
)
from radixrt.runtime.constrained.outlines_regex import to_regex
from radixrt.runtime.constrained.structural import (
    parse_reasoning_constraint,
    parse_tool_call_spec,
)
from radixrt.runtime.constrained.structural_lark import (
    json_schema_with_options,
    reasoning_lark,
    tool_calls_lark,
)
from radixrt.runtime.constrained.token_table import TokenTable

LLGUIDANCE_ENGINE = "llguidance"
MAX_FORCED_TOKENS = 64  # jump-forward appends at most this many tokens at a time
# a compiled llguidance grammar holds its parser tables and lexer states (built lazily, shared
# by the copies each request walks): the cache's byte bound counts it as this many bytes per
# character of its text, an estimate (outlines-core's indexes are counted exactly)
LLGUIDANCE_BYTES_PER_CHAR = 64
GRAMMAR_SUFFIX = ".lark"  # a store file: the checked grammar's text (UTF-8)
_LOG_SILENT = 0


class _TableTokenizer:
    """What llguidance.TokenizerWrapper reads: each token's bytes, the special ids, and the
    tokenizer's own split (llguidance tokenizes forced bytes with it)."""

    def __init__(self, table: TokenTable, tokenizer: Any) -> None:
        self.eos_token_id = table.eos_token_id
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        self.special_token_ids = sorted(
            t for t in range(table.vocab_size) if table.token_bytes[t] is None)
        self.tokens = [data if data is not None else b"" for data in table.token_bytes]
        self._table = table

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # TokenizerWrapper probes with bytes: take str only
            raise TypeError("text must be a str")
        return self._table.encode(text)


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar (its JSON form) of a constraint. ValueError naming the problem."""
    kind, pattern = constraint
    if kind in ("regex", "choices"):
        return LLMatcher.grammar_from_regex(to_regex(constraint))
    if kind == "json_schema":
        try:
            return LLMatcher.grammar_from_json_schema(json_schema_with_options(str(pattern)))
        except ValueError as exc:
            raise ValueError(f"json_schema is invalid: {exc}") from None
    if kind == "lark":
        return LLMatcher.grammar_from_lark(str(pattern))
    if kind == "ebnf":
        try:
            return LLMatcher.grammar_from_lark(gbnf_to_lark(str(pattern)))
        except Exception as exc:  # the converter raises plain Exceptions too  # noqa: BLE001
            raise ValueError(f"ebnf is invalid: {exc}") from None
    if kind == "tool_calls":
        try:
            return LLMatcher.grammar_from_lark(tool_calls_lark(parse_tool_call_spec(str(pattern))))
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"tool_calls: a tool's parameters schema is invalid: {exc}") \
                from None
    if kind == "reasoning":
        fmt, inner = parse_reasoning_constraint(str(pattern))
        inner_grammar = _grammar_entry(grammar_text(inner))
        main = {"name": "main", "lark_grammar": reasoning_lark(fmt, "answer")}
        return json.dumps({"grammars": [main, {**inner_grammar, "name": "answer"}]})
    raise ValueError(f"unknown constraint kind {kind!r}")


def refusal(kind: str, message: str) -> str:
    """What to tell the user about a grammar llguidance refuses: a keyword it cannot enforce by
    name, a regex's own error (not the Lark it was wrapped in), a grammar's with its position."""
    message = message.strip()
    if message.startswith("Unimplemented keys"):
        return f"{kind} uses keywords the llguidance engine cannot enforce: {message}"
    if message.startswith("oneOf constraints are not supported"):
        return (f"{kind} uses a oneOf whose branches may overlap (no proof that a document "
                "matches at most one): the llguidance engine cannot enforce 'exactly one'; "
                "make the branches disjoint (a distinct const or type in each) or say anyOf")
    if kind in ("regex", "choices"):
        reason = [line for line in message.splitlines() if line.startswith("error:")]
        if reason:
            return f"{kind} is invalid: {reason[0][len('error:'):].strip()}"
    return f"{kind} is invalid: {message}"


def _grammar_entry(text: str) -> dict:
    """One grammar of llguidance's grammar list: its JSON form's first, or Lark text's."""
    try:
        return json.loads(text)["grammars"][0]
    except ValueError:  # not JSON: Lark text (what grammar_from_lark gives)
        return {"lark_grammar": text}


class LLGuidanceGrammar(Grammar):
    engine = LLGUIDANCE_ENGINE

    def __init__(self, key: str, table: TokenTable, matcher: LLMatcher) -> None:
        super().__init__(key, table)
        self._start = matcher  # at the start of the output; states are copies of it

    def new_state(self) -> LLGuidanceState:
        return LLGuidanceState(self, self._start.deep_copy())


class LLGuidanceState(GrammarState):
    def __init__(self, grammar: LLGuidanceGrammar, matcher: LLMatcher) -> None:
        super().__init__(grammar)
        self._matcher = matcher
        self._eos = sorted(grammar.table.eos_token_ids)
        self._forced_here: tuple[int, ...] | None = None  # until the next advance / rollback

    def _consume(self, token: int) -> None:
        self._forced_here = None
        if not self._matcher.consume_token(token):
            raise ValueError(f"token {token} is refused by grammar {self.grammar.key}: "
                             f"{self._matcher.get_error().splitlines()[0]}")

    def _accepting(self) -> bool:
        return self._matcher.is_accepting()

    def _forced(self) -> tuple[int, ...]:
        """Asked after each advance (jump-forward) and again by the next step's mask: computed
        once per position."""
        if self._forced_here is None:
            self._forced_here = self._compute_forced()
        return self._forced_here

    def _compute_forced(self) -> tuple[int, ...]:
        matcher = self._matcher
        tokens = list(matcher.compute_ff_tokens()[:MAX_FORCED_TOKENS])
        if len(tokens) == MAX_FORCED_TOKENS:
            return tuple(tokens)
        if tokens:
            matcher.consume_tokens(tokens)
        only_end = matcher.is_stopped() and matcher.is_accepting()  # nothing but the end left
        if tokens:
            matcher.rollback(len(tokens))
        return (*tokens, self.grammar.table.eos_token_id) if only_end else tuple(tokens)

    def _rollback(self, n: int) -> None:
        self._forced_here = None
        self._matcher.rollback(n)

    def write_mask(self, words: torch.Tensor) -> None:
        self._matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        clear_tokens(words, self._eos)


class LLGuidanceEngine(GrammarEngine):
    name = LLGUIDANCE_ENGINE

    def __init__(self, table: TokenTable) -> None:
        super().__init__(table)
        wrapper = llguidance.TokenizerWrapper(_TableTokenizer(table, table.tokenizer))
        self.tokenizer = LLTokenizer(wrapper, n_vocab=table.vocab_size,
                                     eos_token=sorted(table.eos_token_ids))

    def check(self, constraint: Constraint, timeout_s: float) -> None:
        self._checked(constraint)  # milliseconds, bounded by llguidance's own limits

    def compile(self, key: str, constraint: Constraint, timeout_s: float,
                store: Path | None) -> LLGuidanceGrammar:
        """Milliseconds: llguidance bounds its own work (its parser limits), so the time limit
        is never reached here."""
        text = self._checked(constraint)
        grammar = self._grammar(key, text)
        if isinstance(grammar, str):
            raise ValueError(refusal(constraint[0], grammar))
        path = store_path(store, key, GRAMMAR_SUFFIX)
        if path is not None and not path.exists():
            write_atomically(path, text.encode())
        return grammar

    def load(self, key: str, store: Path | None) -> LLGuidanceGrammar | None:
        """The grammar text a compile left in the store (checked then), made a matcher again:
        llguidance has no compiled form to keep; its lexer and parser tables are built lazily,
        as masks ask for them, so this is the cheap part of a compile."""
        path = store_path(store, key, GRAMMAR_SUFFIX)
        if path is None or not path.exists():
            return None
        grammar = self._grammar(key, path.read_bytes().decode())
        return None if isinstance(grammar, str) else grammar

    def _grammar(self, key: str, text: str) -> LLGuidanceGrammar | str:
        """The grammar of checked text, or llguidance's error."""
        matcher = LLMatcher(self.tokenizer, text, log_level=_LOG_SILENT)
        if matcher.is_error():
            return str(matcher.get_error())
        grammar = LLGuidanceGrammar(key, self.table, matcher)
        grammar.nbytes = len(text) * LLGUIDANCE_BYTES_PER_CHAR
        return grammar

    def _checked(self, constraint: Constraint) -> str:
        text = grammar_text(constraint)
        is_error, messages = LLMatcher.validate_grammar_with_warnings(text, self.tokenizer)
        if is_error:
            raise ValueError(refusal(constraint[0], messages[0]))
        return text
