"""The engines benchmarks/json_schema_bench.py runs, each behind one small interface (compile a
schema text or raise Refused; a matcher per walk with the text tokens its mask allows, advance,
whether it may end): radixrt's two through its GrammarCompiler, and llguidance and XGrammar
driven directly on the same tokenizer (compact JSON, as radixrt writes it)."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_schema_docs import StateMatcher  # noqa: E402


class Refused(Exception):
    """The engine refused the schema (its reason)."""


# --- the engines (in their processes) ---------------------------------------------------------
class Radixrt:
    """radixrt's engine `backend` through GrammarCompiler, as a request's json_schema is."""

    def __init__(self, backend: str, tok: Any, table: Any, timeout: float) -> None:
        from radixrt.runtime.constrained.compiler import GrammarCompiler

        self.compiler = GrammarCompiler(table, backend=backend, capacity=1, timeout_s=timeout)
        self.compiler.engine(("json_schema", "{}"))  # made once (llguidance: its tokenizer)

    def compile(self, schema_text: str) -> Any:
        try:
            return self.compiler.get(("json_schema", schema_text))
        except ValueError as exc:  # GrammarTimeout included (a ValueError naming the limit)
            raise Refused(str(exc)) from None

    def matcher(self, compiled: Any) -> Any:
        return StateMatcher(compiled.new_state())

    def close(self) -> None:
        self.compiler.close()


class _EosCleared:
    """A direct engine's matcher as a DocMatcher: its mask less the EOS bits (the walks ask
    accepts_end for the end, as radixrt's worker does)."""

    def __init__(self, matcher: Any, eos: list[int]) -> None:
        self.m = matcher
        self.eos = eos

    def clear_eos(self, words: Any) -> None:
        from radixrt.runtime.constrained.grammar_engine import clear_tokens

        clear_tokens(words, self.eos)


class LLGuidanceMatcher(_EosCleared):
    def write_mask(self, words: Any) -> None:
        self.m.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        self.clear_eos(words)

    def advance(self, token: int) -> bool:
        return bool(self.m.consume_token(token))

    def accepts_end(self) -> bool:
        return bool(self.m.is_accepting())


class LLGuidanceDirect:
    """The llguidance package on the raw schema, compact JSON (its only option set)."""

    def __init__(self, tok: Any, table: Any) -> None:
        import llguidance.hf

        self.eos = [table.eos_token_id]
        self.tokenizer = llguidance.hf.from_tokenizer(tok, n_vocab=table.vocab_size,
                                                      eos_token=table.eos_token_id)

    def compile(self, schema_text: str) -> Any:
        from llguidance import LLMatcher

        try:
            grammar = LLMatcher.grammar_from_json_schema(
                schema_text, defaults={"whitespace_flexible": False})
        except ValueError as exc:
            raise Refused(str(exc)) from None
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise Refused(matcher.get_error())
        return matcher

    def matcher(self, compiled: Any) -> Any:
        return LLGuidanceMatcher(compiled.deep_copy(), self.eos)

    def close(self) -> None:
        return None


class XGrammarMatcher(_EosCleared):
    def write_mask(self, words: Any) -> None:
        self.m.fill_next_token_bitmask(words.view(1, -1))
        self.clear_eos(words)

    def advance(self, token: int) -> bool:
        return bool(self.m.accept_token(token))

    def accepts_end(self) -> bool:
        return bool(self.m.is_completed()) and not self.m.is_terminated()


class XGrammarDirect:
    """XGrammar on the raw schema: compact JSON, its default strict mode, one thread."""

    def __init__(self, tok: Any, table: Any) -> None:
        import xgrammar

        self.xgr = xgrammar
        self.eos = [table.eos_token_id]
        info = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=table.vocab_size,
                                                       stop_token_ids=self.eos)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema_text: str) -> Any:
        try:
            return self.compiler.compile_json_schema(schema_text, any_whitespace=False,
                                                     separators=(",", ":"))
        except Exception as exc:  # noqa: BLE001 -- RuntimeError, InvalidJSONError, ...
            raise Refused(f"{type(exc).__name__}: {exc}") from None

    def matcher(self, compiled: Any) -> Any:
        return XGrammarMatcher(self.xgr.GrammarMatcher(compiled), self.eos)

    def close(self) -> None:
        return None


def unavailable(engine: str) -> str | None:
    """Why an engine cannot run here (None: it can)."""
    module = {"xgrammar": "xgrammar", "llguidance-direct": "llguidance.hf"}.get(engine)
    if module is None:
        return None
    try:
        __import__(module)
    except Exception as exc:  # noqa: BLE001 -- ImportError, or a native library's OSError
        return f"{module} does not import: {type(exc).__name__}: {exc}"
    return None


def make(engine: str, tok: Any, table: Any, timeout: float) -> Any:
    if engine == "llguidance-direct":
        return LLGuidanceDirect(tok, table)
    if engine == "xgrammar":
        return XGrammarDirect(tok, table)
    return Radixrt(engine, tok, table, timeout)
