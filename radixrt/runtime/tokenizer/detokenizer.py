"""Incremental detokenization with stop strings, for streaming.

Two layers, each holding text back for its own reason:

1. Tokens -> text. Decoding one token at a time is wrong (a UTF-8 character or a word-piece can span
   tokens), and decoding everything every step is O(length). We keep two offsets into the token
   list: ``prefix_offset`` (start of a short window of already-emitted tokens kept as left context)
   and ``read_offset`` (end of what has been turned into text). Each step decodes
   ``tokens[prefix_offset:]`` and ``tokens[prefix_offset:read_offset]``; the difference is the new
   text. While the new text ends with U+FFFD (an incomplete UTF-8 character) it is held back, and
   the offsets stay where they are. The window only spans the tokens since the last emission, so
   the cost per token is O(1).
2. Text -> final text. A suffix that could still grow into a stop string is held back (the longest
   suffix that is a prefix of some stop string); when a stop string appears, the text before it is
   final, ``stopped`` becomes True and everything after it is dropped. With several stop strings
   the first one completed wins (earliest end), however the text was split into steps.

The emitted text equals ``tokenizer.decode(output_ids, skip_special_tokens=...)`` cut before the
first stop string. The last few prompt tokens are used as left context only; with a byte-level BPE
tokenizer (the default model's) this changes nothing, and it is dropped if the prompt ends inside a
UTF-8 character. (Sentencepiece tokenizers that strip a leading space from a standalone decode would
keep the first token's space; that is the text that really follows the prompt.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Prompt tokens the incremental detokenizer decodes as left context before the first output token.
DETOKENIZE_PROMPT_CONTEXT = 5


_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] | None = None,
                 skip_special_tokens: bool = True, stop: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stops = (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self._stops), default=0)
        context = list(prompt_ids[-DETOKENIZE_PROMPT_CONTEXT:]) if prompt_ids else []
        if context and self._decode(context).endswith(_REPLACEMENT):
            context = []  # the prompt ends inside a character: no clean left context
        self._ids: list[int] = context  # left context + output tokens
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._held = ""  # decoded text held back because it may start a stop string
        self._emitted: list[str] = []
        self.stopped = False
        self.stop_reason: str | None = None

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._emitted)

    def add(self, token_ids: Sequence[int]) -> str:
        """Take new output tokens; return the text that became final (possibly "")."""
        if self.stopped or not token_ids:
            return ""
        self._ids.extend(int(t) for t in token_ids)
        return self._accept(self._decode_new(flush=False), final=False)

    def finish(self) -> str:
        """End of generation: release everything held back (except a matched stop string)."""
        if self.stopped:
            return ""
        return self._accept(self._decode_new(flush=True), final=True)

    # --- tokens -> text ----------------------------------------------------------------------

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def _decode_new(self, flush: bool) -> str:
        """Text of the tokens past read_offset, or "" while it ends in half a character."""
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset:])
        if not flush and (len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT)):
            return ""  # nothing yet, or an incomplete UTF-8 character: wait for more tokens
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text):]

    # --- text -> final text ------------------------------------------------------------------

    def _accept(self, new_text: str, final: bool) -> str:
        if not self._stops:
            return self._emit(new_text)
        buf = self._held + new_text
        hit = self._find_stop(buf)
        if hit is not None:
            pos, stop = hit
            self.stopped = True
            self.stop_reason = stop
            self._held = ""
            return self._emit(buf[:pos])
        keep = 0 if final else self._partial_stop_len(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return self._emit(buf[:len(buf) - keep])

    def _find_stop(self, buf: str) -> tuple[int, str] | None:
        """The stop string occurrence in buf that is completed first (earliest end; the longest
        one on a tie), so the result does not depend on how the text was split into steps."""
        best: tuple[int, str] | None = None
        best_end = 0
        for stop in self._stops:
            pos = buf.find(stop)
            end = pos + len(stop)
            if pos >= 0 and (best is None or end < best_end
                             or (end == best_end and len(stop) > len(best[1]))):
                best, best_end = (pos, stop), end
        return best

    def _partial_stop_len(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        for n in range(min(len(buf), self._max_stop - 1), 0, -1):
            suffix = buf[-n:]
            if any(stop.startswith(suffix) for stop in self._stops):
                return n
        return 0

    def _emit(self, piece: str) -> str:
        if piece:
            self._emitted.append(piece)
        return piece
