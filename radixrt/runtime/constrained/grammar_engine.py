"""The grammar-engine interface: what every engine that enforces a constraint gives the one
grammar path (compiler -> per-request state -> mask / advance / forced / rollback).

An engine checks a constraint (ValueError naming the problem: a 400 to the user), compiles it
into a Grammar shared by every request with the same constraint, and a Grammar makes one
GrammarState per request. The state's contract, the same for every engine:

- write_mask fills the allowed *text* tokens; EOS is never in it (accepts_end says where the
  output may end, and the worker allows every EOS id there);
- advance takes each output token, EOS included (EOS where the grammar does not accept, or any
  token after it, is a ValueError: the worker never samples one);
- forced is what every accepted output continues with from here (jump-forward appends it; it
  may end with EOS); decoding token by token allows exactly its first token, so jump-forward on
  and off give the same tokens;
- rollback(n) undoes the last n tokens (speculative decoding's rejected drafts).

EOS handling lives here once; engines implement the text side."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch

from radixrt.runtime.constrained.token_table import TokenTable

Constraint = tuple[str, "str | tuple[str, ...]"]
BITS = 32  # masks are 32-bit words: token t at bit t % 32 of word t // 32


class Grammar(ABC):
    """One compiled constraint over one vocabulary (immutable; shared by requests)."""

    engine = ""  # the engine's name (config.GRAMMAR_BACKENDS, less "auto")

    def __init__(self, key: str, table: TokenTable) -> None:
        self.key = key
        self.table = table
        self.nbytes = 0  # memory it holds (what the compiler's cache bound counts)

    @abstractmethod
    def new_state(self) -> GrammarState:
        """A state at the start of the output."""


class GrammarState(ABC):
    """Where one request is in its grammar. Advance it with every output token."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self.ended = False  # EOS was accepted
        self.consumed = 0  # tokens advanced past (EOS included): how far rollback can go

    @classmethod
    def replay(cls, grammar: Grammar, tokens: list[int]) -> GrammarState:
        """A new state advanced past tokens (a request re-admitted after preemption, a fork)."""
        state = grammar.new_state()
        for token in tokens:
            state.advance(token)
        return state

    def advance(self, token: int) -> None:
        if self.ended:
            raise ValueError(f"token {token} after the grammar ended")
        if token in self.grammar.table.eos_token_ids:
            if not self._accepting():
                raise ValueError(f"EOS where grammar {self.grammar.key} does not accept")
            self.ended = True
        else:
            self._consume(token)
        self.consumed += 1

    def accepts_end(self) -> bool:
        return not self.ended and self._accepting()

    def forced(self) -> tuple[int, ...]:
        return () if self.ended else self._forced()

    def rollback(self, n: int) -> None:
        """Undo the last n advanced tokens (EOS included)."""
        if not 0 <= n <= self.consumed:
            raise ValueError(f"cannot roll back {n} tokens: {self.consumed} were advanced")
        if n == 0:
            return
        text = n - 1 if self.ended else n  # the EOS ends the output: it is the last token
        self.ended = False
        if text:
            self._rollback(text)
        self.consumed -= n

    @abstractmethod
    def write_mask(self, words: torch.Tensor) -> None:
        """Fill words ([ceil(vocab / 32)] int32, contiguous, on the CPU) with the allowed text
        tokens: bit t % 32 of word t // 32 (never an EOS id; see accepts_end)."""

    @abstractmethod
    def _consume(self, token: int) -> None:
        """Advance past a text token (ValueError where the grammar refuses it)."""

    @abstractmethod
    def _accepting(self) -> bool:
        """Whether the output may end here."""

    @abstractmethod
    def _forced(self) -> tuple[int, ...]:
        """The tokens every output continues with from here (maybe ending with EOS)."""

    @abstractmethod
    def _rollback(self, n: int) -> None:
        """Undo the last n text tokens."""


class GrammarEngine(ABC):
    """Checks and compiles constraints for one vocabulary."""

    name = ""

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    @abstractmethod
    def check(self, constraint: Constraint, timeout_s: float) -> None:
        """Raise ValueError naming what is wrong with the constraint, or the keyword this
        engine cannot enforce; GrammarTimeout past timeout_s (the Engine checks at submit;
        compile checks again)."""

    @abstractmethod
    def compile(self, key: str, constraint: Constraint, timeout_s: float,
                store: Path | None) -> Grammar:
        """Check and compile (on a compile thread). Raises ValueError as check does, and
        GrammarTimeout past timeout_s. Engines whose compile is slow leave the result in the
        store folder (when there is one), for other processes and for when the cache has
        evicted it: `load` makes it again without compiling."""

    @abstractmethod
    def load(self, key: str, store: Path | None) -> Grammar | None:
        """A grammar this or another process compiled and left in the store (None: not
        there)."""

    def close(self) -> None:
        """Stop what the engine started (compile processes)."""
        return None


def store_path(store: Path | None, key: str, suffix: str) -> Path | None:
    """Where a grammar's file lives in the store folder (None: no store). The compiler makes
    the folder; a folder removed since (a closed Engine's) is not made again."""
    return None if store is None else store / f"{key}{suffix}"


def write_atomically(path: Path, data: bytes) -> None:
    """Readers of the store see the whole file or none (a compile of the same key elsewhere may
    race this one: the last rename wins, with the same bytes)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def clear_tokens(words: torch.Tensor, tokens: Any) -> None:
    """Clear the bits of tokens in a [ceil(vocab / 32)] int32 mask."""
    for token in tokens:
        bit = int(token) % BITS
        words[int(token) // BITS] &= ~(1 << bit) if bit != BITS - 1 else (1 << 31) - 1


def expand_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[n, ceil(vocab / 32)] int32 bitmasks -> [n, vocab_size] bool."""
    shifts = torch.arange(BITS, dtype=torch.int32, device=words.device)  # [32]
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [n, words, 32]
    return bits.bool().reshape(words.shape[0], -1)[:, :vocab_size]


def mask_words(vocab_size: int) -> int:
    return (vocab_size + BITS - 1) // BITS
