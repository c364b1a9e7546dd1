"""A program's calls whose text holds images (rx.image), over a radixrt server's HTTP port: the
native /generate with `image_data`, as SGLang's RuntimeEndpoint sends them.

A completion's prompt is text only, so HttpRuntimeEndpoint sends these calls here: a gen as one
/generate (streamed when the program streams), a fork's pin as a prefill-only /generate with
"pin", and a select as the DSL endpoint scores it (dsl_scoring.py), token by token: the text
alone first (prefilled: its KV in the tree, which every later request of the select hits),
then its last tokens' ids and each choice's, one request each, whose log-probabilities are read
from the first token where the choice's ids part from the text's. Those input logprobs are
asked for from SCORE_LOOKBACK tokens before the text's end; where a choice's id there is not the
text's (its tokenization reaches further back), they are asked again from the prompt's start.
Every request carries the images once, as data: URLs (the server decodes them under its media
limits; the same image is the same placeholders, so the choices share the text's KV, images
included).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from os.path import commonprefix
from typing import Any

import httpx

from radixrt.frontend.backends.http_client import HttpClient, error_message
from radixrt.frontend.lang.backend import (
    PREFILL_ONLY,
    SEPARATE_REASONING,
    BackendError,
    ChoiceLogprobs,
    GenResult,
    PieceCallback,
    constraint_of,
)
from radixrt.frontend.lang.sglang_names import LORA
from radixrt.runtime.sampling_params import SamplingParams

# the choices' input logprobs start this many tokens before the text's end (a choice whose
# tokenization joins the text's last tokens parts from it there; earlier: asked again from 0;
# only a word of more tokens than this re-tokenized whole could part earlier unseen)
SCORE_LOOKBACK = 32
# logprob fields the native API takes as request fields (return_logprob, ...), not in
# sampling_params
_LOGPROB_FIELDS = ("logprobs", "top_logprobs", "prompt_logprobs_start")


def image_data(images: Sequence[bytes]) -> list[str]:
    """The files' bytes as data: URLs (the server reads the format from the bytes)."""
    return ["data:application/octet-stream;base64," + base64.b64encode(bytes(b)).decode()
            for b in images]


class NativeImageCalls:
    """gen, select and pin of texts with images on the server at `root` (its /generate), over
    the endpoint's HTTP client."""

    def __init__(self, http: HttpClient, root: str) -> None:
        self.http = http
        self.root = root

    def generate(self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                 priority: int, images: Sequence[bytes]) -> GenResult:
        if params.get(SEPARATE_REASONING):
            raise BackendError("gen(separate_reasoning=True) needs rx.RuntimeEndpoint(\"tcp://"
                               "...\") or rx.Runtime (a radixrt runtime with --reasoning-parser)")
        constraint = constraint_of(params)
        if constraint is not None and constraint[0] == "tool_calls":
            raise BackendError("gen(tools=...) after rx.image needs rx.RuntimeEndpoint(\"tcp://"
                               "...\") or rx.Runtime: the native /generate returns no parsed "
                               "tool calls")
        fields = {k: v for k, v in params.items() if k != LORA}
        try:
            SamplingParams.from_fields(fields)  # a bad option is refused here, before sending
        except (TypeError, ValueError) as exc:
            raise BackendError(f"gen: {exc}") from None
        body = self._body(text, images, priority)
        body["sampling_params"] = {k: v for k, v in fields.items() if k not in _LOGPROB_FIELDS}
        if params.get(LORA):
            body["lora_path"] = params[LORA]
        if fields.get("logprobs"):
            body.update(return_logprob=True, top_logprobs_num=int(fields.get("top_logprobs") or 0),
                        return_text_in_logprobs=True)
            start = fields.get("prompt_logprobs_start")
            if start is not None:  # native: the entry at logprob_start_len has no logprob
                body["logprob_start_len"] = max(int(start) - 1, 0)
        out = (self._post(body) if on_piece is None
               else self._stream(dict(body, stream=True), on_piece))
        meta = out["meta_info"]
        reason = reason_of(meta.get("finish_reason"))
        if reason is not None and reason.startswith("error"):  # (streamed: no HTTP error)
            raise BackendError(reason)
        logprobs = {}
        for kind in ("output", "input"):
            # the input entries begin at logprob_start_len, one before the first logprob
            skip = 1 if kind == "input" else 0
            if meta.get(f"{kind}_token_logprobs"):
                logprobs[f"{kind}_token_logprobs"] = [
                    tuple(e) for e in meta[f"{kind}_token_logprobs"][skip:]]
            if meta.get(f"{kind}_top_logprobs") is not None:
                logprobs[f"{kind}_top_logprobs"] = [
                    [tuple(e) for e in row or []] for row in meta[f"{kind}_top_logprobs"][skip:]]
        return GenResult(out["text"], reason,
                         meta.get("prompt_tokens", 0), meta.get("cached_tokens", 0),
                         meta.get("completion_tokens", 0), logprobs)

    def pin(self, text: str, priority: int, images: Sequence[bytes]) -> dict[str, Any]:
        """The text prefilled and pinned; its meta_info (pin_id, or pin_error)."""
        body = self._body(text, images, priority)
        body.update(sampling_params=dict(PREFILL_ONLY), pin=True)
        return self._post(body)["meta_info"]

    def score(self, text: str, choices: list[str], priority: int,
              images: Sequence[bytes]) -> list[ChoiceLogprobs]:
        """Each choice's tokens' logprobs after `text` (dsl_scoring's rule)."""
        if not text:
            raise BackendError("select needs some text before it to score the choices against")
        # the text alone first: its KV in the tree (every later request hits it), its length
        prefix = self._post(dict(self._body(text, images, priority),
                                 sampling_params=dict(PREFILL_ONLY)))
        from_pos = max(int(prefix["meta_info"]["prompt_tokens"]) - SCORE_LOOKBACK, 0)
        prefix_ids, _ = self._entries(text, priority, images, from_pos)
        scored = [self._entries(text + c, priority, images, from_pos) for c in choices]
        if from_pos and any(len(ids) <= from_pos or ids[from_pos] != prefix_ids[from_pos]
                            for ids, _ in scored):
            from_pos = 0  # a choice parts from the text before the lookback: all of it
            prefix_ids, _ = self._entries(text, priority, images, 0)
            scored = [self._entries(text + c, priority, images, 0) for c in choices]
        start = max(1, min(min(len(commonprefix([prefix_ids, ids])), len(ids) - 1)
                           for ids, _ in scored))
        if start <= from_pos:  # its logprob is not in what came back (from_pos has none)
            from_pos = start - 1
            scored = [self._entries(text + c, priority, images, from_pos) for c in choices]
        return [ChoiceLogprobs([float(lp) for lp in logprobs[start - from_pos:]])
                for _ids, logprobs in scored]

    def _entries(self, text: str, priority: int, images: Sequence[bytes],
                 from_pos: int) -> tuple[list[int], list[float | None]]:
        """The prompt's ids from from_pos on (-1 before: the same for every prompt of the
        select, whose texts agree there) and the logprob of each position from from_pos on
        (None at from_pos): one prefill-only /generate, the images sent once."""
        body = self._body(text, images, priority)
        body.update(return_logprob=True, logprob_start_len=from_pos,
                    sampling_params=dict(PREFILL_ONLY))
        triples = self._post(body)["meta_info"]["input_token_logprobs"]
        return [-1] * from_pos + [int(e[1]) for e in triples], [e[0] for e in triples]

    def _body(self, text: str | list[str], images: Sequence[bytes],
              priority: int) -> dict[str, Any]:
        body: dict[str, Any] = {"text": text}
        if images:
            body["image_data"] = image_data(images)
        if priority:
            body["priority"] = priority
        return body

    def _post(self, body: dict[str, Any]) -> Any:
        try:
            response = self.http.request("POST", self.root + "/generate", json=body)
        except httpx.HTTPError as exc:
            raise BackendError(f"{self.root} did not answer: {exc}") from None
        if response.status_code != 200:
            raise BackendError(error_message(response))
        return response.json()

    def _stream(self, body: dict[str, Any], on_piece: PieceCallback) -> dict[str, Any]:
        """A streamed /generate: each event holds the text so far; on_piece gets what is new.
        Returns the last event."""
        last: dict[str, Any] = {"text": "", "meta_info": {}}
        for event in self.http.events(self.root + "/generate", body):
            new = event["text"][len(last["text"]):]
            if new:
                on_piece(new)
            last = event
        return last


def reason_of(finish: Any) -> str | None:
    """SGLang's meta_info finish_reason ({"type": "stop", ...}) as a gen's finish reason: its
    type, or the runtime's "error: ..." message of an abort that was one."""
    if not isinstance(finish, dict):
        return finish
    message = str(finish.get("message") or "")
    return message if finish.get("type") == "abort" and message.startswith("error") else (
        finish.get("type"))

