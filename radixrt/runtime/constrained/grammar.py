"""The outlines-core engine's grammar (an Index over the model's vocabulary) and the per-request
state that walks it (grammar_engine.py's interface): the allowed-token bitmask of each step,
and the forced continuation that jump-forward appends without sampling.

Forced continuation: from a state where every accepted output continues with the same bytes
(the keys and punctuation of a JSON object, say), those bytes are forced. They are found byte by
byte (the first bytes of the allowed tokens) and tokenized by longest match through the automaton,
so decoding with jump-forward on or off gives the same tokens: off, each forced token is the
only one the mask allows; on, they are appended at once. A state that only accepts the end
forces EOS.

The end marker: outlines-core's Index drops a token that leads from an accepting state into a
non-accepting one when the text before the token's last byte is accepted (its DFA's matches
are delayed by one byte): after "Yes" under `Yes( sir)?`, the token " " was refused, and free
text followed by a tool call could never start the call. So the compiler indexes `(?:R)\x00`
instead: nothing is accepting before the marker byte, so no token is dropped. Here the marker's
single-byte token stands for EOS: the mask never allows the marker itself, and EOS is allowed
exactly where reading the marker completes the pattern (the marker may also be a character the
pattern takes, as in `.*`; the model can never write it).
"""

from __future__ import annotations

import numpy as np
import torch
from outlines_core import Guide, Index

from radixrt.runtime.config import GRAMMAR_END_MARKER
from radixrt.runtime.constrained.grammar_engine import Grammar, GrammarState, clear_tokens
from radixrt.runtime.constrained.token_table import TokenTable

OUTLINES_ENGINE = "outlines"
MAX_GUIDE_ROLLBACK = 64  # the Guide keeps this many prior states; a longer rollback replays
MAX_FORCED_TOKENS = 64  # jump-forward appends at most this many tokens at a time

END_MARKER = GRAMMAR_END_MARKER  # the compiler appends it to every grammar (module docstring)


class CompiledGrammar(Grammar):
    engine = OUTLINES_ENGINE

    def __init__(self, key: str, index: Index, table: TokenTable, end_marked: bool) -> None:
        """end_marked: the index is of `(?:R)\\x00` (OutlinesEngine.plan)."""
        super().__init__(key, table)
        self.index = index
        # the marker's token stands for EOS (None: plain final states); no token holding the
        # marker byte is ever allowed
        self.end_token = end_marker_token(table) if end_marked else None
        self.marker_tokens = table.marker_tokens if end_marked else np.zeros(0, np.int64)
        self._forced: dict[int, tuple[int, ...]] = {}  # state -> forced tokens from it
        self._eos = np.array(sorted(table.eos_token_ids), dtype=np.int64)

    def accepts_end(self, state: int) -> bool:
        """Whether the output may end in `state` (EOS allowed)."""
        if self.end_token is None:
            return bool(self.index.is_final_state(state))
        # the marker may also be a character the grammar takes (`.*`): the end is where reading
        # it completes the whole pattern
        after = self.index.get_next_state(state, self.end_token)
        return after is not None and bool(self.index.is_final_state(after))

    def text_tokens(self, state: int) -> np.ndarray:
        """The tokens allowed in `state` other than the end (the marker, EOS)."""
        allowed = np.asarray(self.index.get_allowed_tokens(state), dtype=np.int64)
        return allowed[~np.isin(allowed, np.append(self._eos, self.marker_tokens))]

    def forced_from(self, state: int) -> tuple[int, ...]:
        """The tokens every output continues with from `state` (maybe ending with EOS)."""
        chain = self._forced.get(state)
        if chain is None:
            chain = self._compute_forced(state)
            self._forced[state] = chain
        return chain

    def _compute_forced(self, start: int) -> tuple[int, ...]:
        forced = bytearray()
        state = start
        while len(forced) < MAX_FORCED_TOKENS * 8:
            if self.accepts_end(state):
                break  # the output may end here: nothing is forced
            allowed = self.text_tokens(state)
            if not len(allowed):
                break
            firsts = np.unique(self.table.first_byte[allowed])
            byte_token = self.table.byte_token[int(firsts[0])] if len(firsts) == 1 else -1
            if byte_token < 0 or firsts[0] < 0:
                break
            nxt = self.index.get_next_state(state, byte_token)
            if nxt is None:
                break
            forced.append(int(firsts[0]))
            state = nxt
        tokens = self._tokenize(start, bytes(forced))
        end = start
        for token in tokens:
            end = self.index.get_next_state(end, token)
        if len(tokens) < MAX_FORCED_TOKENS and self._only_end(end):
            tokens.append(self.table.eos_token_id)
        return tuple(tokens[:MAX_FORCED_TOKENS])

    def _tokenize(self, state: int, data: bytes) -> list[int]:
        """Tokens for the forced bytes: the tokenizer's own split where the automaton accepts
        it (else longest match), less a last token the model could extend past the forced text
        (a `[` where `["` is allowed too: the model chooses there)."""
        tokens = self._tokenizer_split(state, data) or self._longest_match(state, data)
        if tokens:
            before = state
            for token in tokens[:-1]:
                before = self.index.get_next_state(before, token)
            last = self.table.token_bytes[tokens[-1]] or b""
            if any(
                (piece := self.table.token_bytes[t]) and len(piece) > len(last)
                and piece.startswith(last)
                for t in self.text_tokens(before)
            ):
                tokens.pop()
        return tokens

    def _tokenizer_split(self, state: int, data: bytes) -> list[int] | None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        tokens = list(self.table.encode(text)) if text else []
        if b"".join(self.table.token_bytes[t] or b"\0" for t in tokens) != data:
            return None
        for token in tokens:
            nxt = self.index.get_next_state(state, token)
            if nxt is None:
                return None
            state = nxt
        return tokens

    def _longest_match(self, state: int, data: bytes) -> list[int]:
        tokens: list[int] = []
        pos = 0
        while pos < len(data):
            best, best_len = -1, 0
            for token in self.text_tokens(state):
                piece = self.table.token_bytes[int(token)]
                if piece and len(piece) > best_len and data.startswith(piece, pos):
                    best, best_len = token, len(piece)
            if best < 0:
                break
            tokens.append(int(best))
            state = self.index.get_next_state(state, int(best))
            pos += best_len
        return tokens

    def _only_end(self, state: int) -> bool:
        return self.accepts_end(state) and not len(self.text_tokens(state))

    def new_state(self) -> OutlinesState:
        return OutlinesState(self)


class OutlinesState(GrammarState):
    def __init__(self, grammar: CompiledGrammar) -> None:
        super().__init__(grammar)
        self.grammar: CompiledGrammar = grammar
        self._guide = Guide(grammar.index, max_rollback=MAX_GUIDE_ROLLBACK)
        self._tokens: list[int] = []  # text tokens advanced past (a long rollback replays)

    @property
    def state(self) -> int:
        return int(self._guide.get_state())

    def _consume(self, token: int) -> None:
        if token in self.grammar.marker_tokens:
            raise ValueError(f"token {token} holds the end marker of grammar {self.grammar.key}")
        self._guide.advance(token, return_tokens=False)
        self._tokens.append(token)

    def _accepting(self) -> bool:
        return self.grammar.accepts_end(self.state)

    def _forced(self) -> tuple[int, ...]:
        return self.grammar.forced_from(self.state)

    def _rollback(self, n: int) -> None:
        kept = self._tokens[: len(self._tokens) - n]
        if n <= self._guide.get_allowed_rollback():
            self._guide.rollback_state(n)
        else:
            self._guide = Guide(self.grammar.index, max_rollback=MAX_GUIDE_ROLLBACK)
            for token in kept:
                self._guide.advance(token, return_tokens=False)
        self._tokens = kept

    def write_mask(self, words: torch.Tensor) -> None:
        self._guide.write_mask_into(words.data_ptr(), words.numel(), 4)
        clear_tokens(words, self.grammar.marker_tokens.tolist())


def end_marker_token(table: TokenTable) -> int | None:
    """The single-byte token of END_MARKER (None where the vocabulary has none)."""
    token = table.byte_token[END_MARKER]
    return token if token >= 0 else None
