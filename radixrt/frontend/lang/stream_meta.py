"""A gen's meta info as the text iterators and get_meta_info give it.

The meta info that comes with each piece of a gen's text in
`state.text_async_iter(name, return_meta_data=True)` (SGLang's streamed meta info), built from the
backend's streamed pieces (PieceMeta) and the gen's final result.

Each yielded piece's meta has `completion_tokens`: the gen's tokens so far (left out where the
backend does not say how many tokens a piece holds); and, when logprobs were asked for,
`output_token_logprobs` (and `output_top_logprobs`) with ONLY the entries new since the previous
yielded piece, and `output_token_logprobs_length`: all of the gen's entries so far. A piece with
tokens but no text (a character not complete yet, text held back while it may start a stop string)
yields nothing: its entries go with the next piece that has text. The gen's last piece (the
final reply's text past what was streamed, or the whole output of an unstreamed gen) carries the
gen's meta info (finish_reason, token counts), its logprob entries as those of a piece, and closes
the counts with the final reply's totals; a streamed gen whose last tokens bring no text (its end
of sequence token) yields no piece for them.

`with_token_texts`: gen(return_text_in_logprobs=True) makes every logprob entry (logprob,
token_id, token_text), as SGLang shapes them: the ids each decoded on their own by the backend's
`token_texts` (the model's tokenizer), where the backend gave ids without texts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from radixrt.frontend.lang.backend import BackendError, PieceMeta

LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs")
# meta info keys whose entries are (logprob, token_id, token_text), or lists of them (top)
ENTRY_KEYS = ("output_token_logprobs", "input_token_logprobs")
TOP_KEYS = ("output_top_logprobs", "input_top_logprobs")


class GenStream:
    def __init__(self, logprobs: bool) -> None:
        self.logprobs = logprobs  # the gen asked for them
        self.tokens = 0  # tokens so far
        self.tokens_known = True  # every piece said its tokens
        self.entries = 0  # output_token_logprobs entries so far
        self.yielded = 0  # ... of which went with a yielded piece
        self.pending: dict[str, list[Any]] = {key: [] for key in LOGPROB_KEYS}

    def piece(self, text: str, meta: PieceMeta | None) -> dict[str, Any] | None:
        """A streamed piece arrived: the meta to yield with it, or None (no text: nothing is
        yielded, its entries wait for the next piece)."""
        if meta is None:
            self.tokens_known = False
        else:
            self.tokens += meta.tokens
            for key in LOGPROB_KEYS:
                self.pending[key] += meta.logprobs.get(key, [])
            self.entries += len(meta.logprobs.get(LOGPROB_KEYS[0], []))
        if not text:
            return None
        out: dict[str, Any] = {}
        if self.tokens_known:
            out["completion_tokens"] = self.tokens
        if self.logprobs:
            out.update(self.pending)
            out["output_token_logprobs_length"] = self.entries
            self.pending = {key: [] for key in LOGPROB_KEYS}
            self.yielded = self.entries
        return out

    def last(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The meta to yield with the gen's last piece, from its full meta info (`meta`, what
        get_meta_info gives)."""
        out = dict(meta)
        if self.logprobs:
            for key in LOGPROB_KEYS:
                out[key] = list(meta.get(key, []))[self.yielded:]
            out["output_token_logprobs_length"] = len(meta.get(LOGPROB_KEYS[0], []))
            self.yielded = out["output_token_logprobs_length"]
        return out


def with_token_texts(meta: dict[str, Any],
                     decode: Callable[[Sequence[int]], Sequence[str]] | None) -> dict[str, Any]:
    """`meta` with every logprob entry's text: given ones kept, the others decoded (each id on
    its own, in one call to `decode`). No decoder where one is needed: BackendError."""
    entries = [e for k in ENTRY_KEYS for e in meta.get(k, [])]
    entries += [e for k in TOP_KEYS for top in meta.get(k, []) for e in top]
    ids = sorted({e[1] for e in entries if e[2] is None and e[1] is not None})
    if not ids:
        return meta
    if decode is None:
        raise BackendError("gen(return_text_in_logprobs=True): this backend cannot decode "
                           "token ids (rx.Runtime and rx.RuntimeEndpoint can)")
    text_of = dict(zip(ids, decode(ids)))

    def fill(entry: tuple) -> tuple:
        if entry[2] is not None or entry[1] is None:
            return entry
        return (entry[0], entry[1], text_of[entry[1]])

    out = dict(meta)
    for key in ENTRY_KEYS:
        if key in meta:
            out[key] = [fill(e) for e in meta[key]]
    for key in TOP_KEYS:
        if key in meta:
            out[key] = [[fill(e) for e in top] for top in meta[key]]
    return out
