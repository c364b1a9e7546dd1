"""OpenAICompatible: run DSL programs on any OpenAI-compatible server (radixrt's HTTP, vLLM,
SGLang, ...) through its legacy /v1/completions endpoint.

gen is a completion of the state's text (a constrained gen sends its regex / choices as extra
fields and a JSON schema as response_format, and checks that the server enforced it); select
scores every choice in ONE request (the prompt
list [text + choice, ...] with echo and logprobs, max_tokens=0), reading the log-probabilities
of the tokens past the text. There is no pinning over HTTP: the server's own prefix cache, if
it has one, does the reuse. Roles need the model's chat markers: read from a radixrt server's
/server_info, or given as chat_format ("chatml", "llama-3" or a ChatFormat). rx.image is
refused: a completion's prompt is text, and there is no chat message to put an image part in
(HttpRuntimeEndpoint, on a radixrt server, sends those calls to its native /generate).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any

import httpx

from radixrt.frontend.backends.http_client import HttpClient, error_message
from radixrt.frontend.backends.next_token_scoring import NoScoringRoute, score_by_next_tokens
from radixrt.frontend.lang.backend import (
    SEPARATE_REASONING,
    BackendError,
    ChatFormat,
    ChoiceLogprobs,
    GenResult,
    PieceCallback,
    TokenUsage,
    constraint_of,
)
from radixrt.frontend.lang.runners import spawn
from radixrt.frontend.lang.sglang_names import LORA
from radixrt.runtime.config import DEFAULT_MAX_TOKENS
from radixrt.runtime.sampling_params import CONSTRAINT_FIELDS

CHAT_FORMATS = {
    "chatml": ChatFormat({r: (f"<|im_start|>{r}\n", "<|im_end|>\n")
                          for r in ("system", "user", "assistant")}),
    "llama-3": ChatFormat({r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>")
                           for r in ("system", "user", "assistant")}),
}
_NOT_SENT = ("logprobs", "top_logprobs", "prompt_logprobs_start", "n", LORA,
             *CONSTRAINT_FIELDS)  # a constraint: sent as constraint_fields says
HTTP_TIMEOUT_S = 600.0


class OpenAICompatible:
    # why rx.image cannot run here (the executor's message; generate takes no images=)
    no_images = ("rx.image needs rx.Runtime or rx.RuntimeEndpoint (tcp:// or http://) on a "
                 "vision-language model: this backend sends /v1/completions text prompts, "
                 "which carry no images")
    sends_images = False  # (HttpRuntimeEndpoint's calls take images= on a radixrt server)

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 chat_format: str | ChatFormat | None = None,
                 timeout: float = HTTP_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        """base_url: the API root ending in /v1 (e.g. http://127.0.0.1:30000/v1); transport:
        httpx's, for a proxy, TLS settings or a recorded server."""
        self.base_url = base_url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = HttpClient(headers, timeout, transport)  # blocking, or on arun's loop
        self._chat = self._resolve_chat(chat_format)
        self._start: str | None = None  # the start token as text (unconditional scores)
        self._next_token_scoring = False  # the server does not echo prompt logprobs
        self.token_usage = TokenUsage()  # what the completions' `usage` said

    # --- Backend ------------------------------------------------------------------------------
    def chat_format(self) -> ChatFormat:
        return self._chat

    def generate(self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                 priority: int = 0) -> GenResult:
        if params.get(SEPARATE_REASONING):
            raise BackendError("gen(separate_reasoning=True) needs rx.RuntimeEndpoint or "
                               "rx.Runtime (a radixrt runtime with --reasoning-parser)")
        if params.get("prompt_logprobs_start") is not None:
            raise BackendError("OpenAICompatible returns the output's token logprobs only: "
                               "prompt logprobs (SGLang's logprob_start_len) need "
                               "rx.RuntimeEndpoint or rx.Runtime")
        body = {k: v for k, v in params.items() if k not in _NOT_SENT}
        if priority:  # an extra field (radixrt's, vLLM's): sent only when a program sets one
            body["priority"] = priority
        top = int(params.get("top_logprobs") or 0)
        if params.get("logprobs"):
            body["logprobs"] = max(top, 1)  # OpenAI's: the top k, the sampled token's as well
        body.setdefault("max_tokens", DEFAULT_MAX_TOKENS)  # the runtime's rule, as far as it goes
        # a LoRA adapter is served as a model of its own (OpenAI's way: vLLM, radixrt)
        body.update(model=params.get(LORA) or self.model, prompt=text,
                    **constraint_fields(params))
        if on_piece is None or "logprobs" in body:
            data = self._post(body)
            choice = data["choices"][0]
            usage = data.get("usage") or {}
            result = GenResult(choice["text"], choice.get("finish_reason"),
                               usage.get("prompt_tokens", 0),
                               (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                               usage.get("completion_tokens", 0),
                               openai_logprob_meta(choice.get("logprobs"), top))
            if on_piece is not None and result.text:
                on_piece(result.text)
        else:
            result = self._stream(body, on_piece)
        self.token_usage.add(result.prompt_tokens, result.completion_tokens,
                             result.cached_tokens)
        check_constrained(params, result, self.base_url)
        return result

    def get_model_name(self) -> str:
        """SGLang's name: the model this backend asks for."""
        return self.model

    def score(self, text: str, choices: list[str], unconditional: bool,
              priority: int = 0) -> list[ChoiceLogprobs]:
        """One echo request (text + choice prompts, max_tokens 0); a server that does not echo
        prompt logprobs (llama-server) is scored from next-token logprobs instead
        (next_token_scoring.py), and remembered as such."""
        if self._next_token_scoring:
            return self._score_next_tokens(text, choices, unconditional)
        # alone = after the model's start token, as radixrt's /server_info names it (so the
        # scores equal RuntimeEndpoint's); elsewhere the choice's first token goes unscored
        start = self._score_start() if unconditional else ""
        scores = self._echo_scores([(text, c) for c in choices]
                                   + ([(start, c) for c in choices] if unconditional else []),
                                   priority)
        if scores is None:
            self._next_token_scoring = True
            return self._score_next_tokens(text, choices, unconditional)
        for choice, cond in zip(choices, scores):
            if not cond:
                raise BackendError(f"the server returned no log-probabilities for {choice!r}")
        return [ChoiceLogprobs(scores[i], scores[len(choices) + i] if unconditional else [])
                for i in range(len(choices))]

    def _echo_scores(self, pairs: list[tuple[str, str]], priority: int) -> list[list[float]] | None:
        """Per (text, choice): the logprobs of the choice's tokens after the text, from ONE
        echo request; None when the server does not echo prompt logprobs."""
        prompts = [text + c for text, c in pairs]
        body = {"model": self.model, "prompt": prompts, "echo": True, "logprobs": 1,
                "max_tokens": 0, "temperature": 0.0}
        if priority:
            body["priority"] = priority
        data = self._post(body)
        by_index = sorted(data["choices"], key=lambda c: c["index"])
        if not _echoed(by_index[0].get("logprobs"), len(prompts[0])):
            return None
        return [_logprobs_after(choice["logprobs"], len(text))
                for (text, _), choice in zip(pairs, by_index)]

    def _score_next_tokens(self, text: str, choices: list[str],
                           unconditional: bool) -> list[ChoiceLogprobs]:
        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            root = self.base_url if path == "/completions" else self._root()
            return self._post(body, root + path)

        try:
            return score_by_next_tokens(post, self.model, text, choices, unconditional)
        except NoScoringRoute as exc:
            raise BackendError(
                f"{self.base_url} returns no prompt log-probabilities for `select` (it ignores "
                f"echo), and scoring from next-token logprobs failed too: {exc}. Use "
                "rx.Runtime / rx.RuntimeEndpoint, or a server that echoes logprobs (vLLM, "
                "SGLang) or has /tokenize and token-id logprobs (llama.cpp's llama-server)"
            ) from None

    def embed(self, text: str, dimensions: int | None, priority: int = 0) -> list[float]:
        """POST /v1/embeddings (the server's embedding of its model)."""
        body: dict[str, Any] = {"model": self.model, "input": text, "encoding_format": "float"}
        if dimensions is not None:
            body["dimensions"] = dimensions
        if priority:
            body["priority"] = priority
        data = self._post(body, self.base_url + "/embeddings")
        usage = data.get("usage") or {}
        self.token_usage.add(usage.get("prompt_tokens", 0), 0, usage.get("cached_tokens", 0))
        return list(data["data"][0]["embedding"])

    def pin(self, text: str, priority: int = 0) -> None:
        return None

    def unpin(self, handle: Any) -> None:
        return None

    # the async twins arun's programs call: the same code as a greenlet on the caller's loop,
    # its HTTP made there by an AsyncClient (http_client.py), so no thread waits for it
    async def agenerate(self, *args: Any, **kwargs: Any) -> GenResult:
        return await spawn(functools.partial(self.generate, *args, **kwargs))

    async def ascore(self, *args: Any, **kwargs: Any) -> list[ChoiceLogprobs]:
        return await spawn(functools.partial(self.score, *args, **kwargs))

    async def aembed(self, *args: Any, **kwargs: Any) -> list[float]:
        return await spawn(functools.partial(self.embed, *args, **kwargs))

    async def apin(self, *args: Any, **kwargs: Any) -> Any:
        return await spawn(functools.partial(self.pin, *args, **kwargs))

    async def aunpin(self, *args: Any, **kwargs: Any) -> None:
        await spawn(functools.partial(self.unpin, *args, **kwargs))

    def flush_cache(self) -> int:
        """A radixrt server's POST /flush_cache (others have none: BackendError)."""
        try:
            response = self._http.request("POST", self._root() + "/flush_cache")
        except httpx.HTTPError as exc:
            raise BackendError(f"{self.base_url} did not answer: {exc}") from None
        if response.status_code != 200:
            raise BackendError(f"{self._root()} has no cache to flush ({error_message(response)})")
        return int(response.json().get("freed_tokens", 0))

    def _score_start(self) -> str:
        if self._start is None:
            self._start = str(self.info().get("score_start", ""))
        return self._start

    def info(self) -> dict[str, Any]:
        """A radixrt server's /server_info; {} from servers without one."""
        try:
            response = self._http.request("GET", self._root() + "/server_info")
        except httpx.HTTPError:
            return {}
        return response.json() if response.status_code == 200 else {}

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> OpenAICompatible:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------------
    def _root(self) -> str:
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def _resolve_chat(self, chat_format: str | ChatFormat | None) -> ChatFormat:
        if isinstance(chat_format, ChatFormat):
            return chat_format
        if chat_format is not None:
            if chat_format not in CHAT_FORMATS:
                raise ValueError(f"chat_format {chat_format!r} is unknown: use one of "
                                 f"{sorted(CHAT_FORMATS)} or a ChatFormat")
            return CHAT_FORMATS[chat_format]
        chat = ChatFormat.from_info(self.info().get("chat", {}))
        # a radixrt server names its image text; completions' text prompts cannot carry images
        return chat if self.sends_images else dataclasses.replace(chat, image_token="")

    def _post(self, body: dict[str, Any], url: str | None = None) -> dict[str, Any]:
        try:
            response = self._http.request("POST", url or self.base_url + "/completions",
                                          json=body)
        except httpx.HTTPError as exc:
            raise BackendError(f"{self.base_url} did not answer: {exc}") from None
        if response.status_code != 200:
            raise BackendError(error_message(response))
        return response.json()

    def _stream(self, body: dict[str, Any], on_piece: PieceCallback) -> GenResult:
        body = dict(body, stream=True, stream_options={"include_usage": True})
        pieces: list[str] = []
        reason = None
        usage: dict[str, Any] = {}
        for chunk in self._http.events(self.base_url + "/completions", body):
            usage = chunk.get("usage") or usage  # the last chunk's (include_usage)
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    pieces.append(choice["text"])
                    on_piece(choice["text"])
                reason = choice.get("finish_reason") or reason
        return GenResult("".join(pieces), reason, usage.get("prompt_tokens", 0),
                         (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                         usage.get("completion_tokens", 0))


def constraint_fields(params: dict[str, Any]) -> dict[str, Any]:
    """The constraint in a gen's params as request fields: `regex`, `choices`, `ebnf` and
    `lark` extras (radixrt's, SGLang's and vLLM's names), a JSON schema as OpenAI's
    response_format."""
    constraint = constraint_of(params)
    if constraint is None:
        return {}
    kind, pattern = constraint
    if kind == "tool_calls":
        raise BackendError("gen(tools=...) needs rx.RuntimeEndpoint or rx.Runtime: completions "
                           "servers take no tool-call grammar (on a radixrt server, its chat "
                           "endpoint takes OpenAI's tools)")
    if kind == "json_schema":
        schema = json.loads(pattern) if isinstance(pattern, str) else pattern
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "output", "schema": schema}}}
    return {kind: list(pattern) if kind == "choices" else pattern}


def check_constrained(params: dict[str, Any], result: GenResult, base_url: str) -> None:
    """A server that ignored the constraint in params is caught, not trusted: a finished output
    must match (a regex Python cannot parse, or an output cut by max_tokens, is taken as it
    is)."""
    constraint = constraint_of(params)
    if constraint is None or result.finish_reason == "length":
        return
    kind, pattern = constraint
    text = result.text
    if kind == "choices":
        ok = text in pattern
    elif kind == "json_schema":
        try:
            json.loads(text)
            ok = True
        except ValueError:
            ok = False
    elif kind in ("ebnf", "lark"):
        ok = True  # no parser of those grammars here: the output is taken as it is
    else:
        try:
            ok = re.fullmatch(pattern, text) is not None
        except re.error:
            ok = True
    if not ok:
        raise BackendError(
            f"{base_url} did not enforce gen({kind}=...): its output {text[:200]!r} does not "
            f"match. The server ignores the constraint; use rx.Runtime / rx.RuntimeEndpoint, or "
            "a server that takes `regex` / `choices` / response_format json_schema")


def openai_logprob_meta(logprobs: dict[str, Any] | None, top: int) -> dict[str, Any]:
    """A completion choice's `logprobs` in SGLang's meta info shape: (logprob, None, token
    text) entries (the OpenAI API names tokens by their text, not their ids)."""
    if not logprobs or not logprobs.get("tokens"):
        return {}
    meta: dict[str, Any] = {"output_token_logprobs": [
        (lp, None, token) for token, lp in zip(logprobs["tokens"], logprobs["token_logprobs"])]}
    if top:
        meta["output_top_logprobs"] = [
            sorted(((lp, None, t) for t, lp in (entry or {}).items()), reverse=True)[:top]
            for entry in logprobs.get("top_logprobs") or []]
    return meta


def _echoed(logprobs: dict[str, Any] | None, prompt_chars: int) -> bool:
    """Whether a completion's (legacy) logprobs cover its prompt: the server echoed it."""
    tokens = (logprobs or {}).get("tokens")
    return bool(tokens) and sum(len(t) for t in tokens) >= prompt_chars


def _logprobs_after(logprobs: dict[str, Any], start_char: int) -> list[float]:
    """Log-probabilities of the tokens that end past character start_char of the echoed text
    (where a token starts: `text_offset`, or, for servers without it, the tokens' lengths)."""
    tokens = logprobs["tokens"]
    offsets = logprobs.get("text_offset")
    if offsets is None:
        offsets = [0] * len(tokens)
        for i in range(1, len(tokens)):
            offsets[i] = offsets[i - 1] + len(tokens[i - 1])
    out = []
    for offset, token, lp in zip(offsets, tokens, logprobs["token_logprobs"]):
        if offset + len(token) > start_char and lp is not None:
            out.append(float(lp))
    return out

