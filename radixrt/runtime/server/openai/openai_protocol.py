"""OpenAI-compatible shapes of POST /v1/completions and POST /v1/chat/completions: the request
models, their conversion to SamplingParams, the response models and the error format.

Unknown request fields are ignored (clients send many), but the OpenAI chat fields this server
does not implement are refused by name (ChatRequest.unsupported); known ones are type-checked
by pydantic and value-checked by SamplingParams, whose ValueError messages become HTTP 400s.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from radixrt.runtime.config import (
    MAX_NAME_CHARS,
    MAX_TOOL_CALL_ID_CHARS,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
)
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.core.error_shapes import APIError, param_of
from radixrt.runtime.server.openai.tool_protocol import (
    NamedToolChoice,
    ToolCallDeltaOut,
    ToolCallIn,
    ToolCallOut,
    ToolDef,
)

MAX_CONTENT_PARTS = 256  # per chat message
MAX_TEMPLATE_KWARGS = 32  # chat_template_kwargs entries

# --- requests ----------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False


class ResponseFormat(BaseModel):
    """OpenAI's: {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}, or
    {"type": "json_object"} (any JSON object), or {"type": "text"}; and vLLM's
    {"type": "grammar", "grammar": "..."} (GBNF or Lark, told apart by their syntax)."""

    type: Literal["text", "json_object", "json_schema", "grammar"]
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None


class SamplingFields(BaseModel):
    """The fields both endpoints share. None means "not given": SamplingParams' default."""

    model: str = Field(max_length=MAX_NAME_CHARS)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    user: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    response_format: ResponseFormat | None = None
    # constrained decoding beyond response_format (as SGLang's and vLLM's servers take them)
    regex: str | None = None
    json_schema: dict[str, Any] | str | None = None
    choices: list[str] | None = None
    ebnf: str | None = None  # a context-free grammar in GBNF (SGLang's and llama.cpp's name)
    lark: str | None = None  # ... or in Lark (vLLM's and llguidance's syntax)
    # scheduling (extra body fields, as vLLM takes them): lower priority = more urgent; requests
    # with different cache_salt never share cached KV; timeout: seconds it may wait in the queue
    priority: int | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    timeout: float | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False


class ImageURL(BaseModel):
    url: str = Field(min_length=1)  # a data: or http(s) URL
    detail: str | None = Field(default=None, max_length=MAX_NAME_CHARS)  # accepted, ignored


class ContentPart(BaseModel):
    type: str = Field(max_length=MAX_NAME_CHARS)
    text: str | None = None
    image_url: ImageURL | str | None = None

    def image(self) -> str | None:
        """An image_url part's URL (None for a text part)."""
        if self.type != "image_url":
            return None
        if self.image_url is None:
            raise APIError('an image_url part needs "image_url": {"url": ...}',
                           param="messages")
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url

    def text_of(self) -> str:
        if self.image() is not None:
            return ""
        if self.type != "text" or self.text is None:
            raise APIError(f"content part of type {self.type!r} is not supported: send "
                           '{"type": "text", "text": ...} and {"type": "image_url", '
                           '"image_url": {"url": ...}} parts', param="messages")
        return self.text


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    tool_calls: Annotated[list[ToolCallIn], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: str | None = Field(default=None, max_length=MAX_TOOL_CALL_ID_CHARS)
    reasoning_content: str | None = None  # an earlier turn's thinking (templates may drop it)

    def text(self) -> str:
        """Its text (image parts left out)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text_of() for part in self.content)

    def images(self) -> list[str]:
        """Its image parts' URLs, in order."""
        parts = self.content if isinstance(self.content, list) else ()
        return [url for part in parts if (url := part.image()) is not None]

    def template_content(self) -> str | list[dict[str, Any]]:
        """Its content as the chat template takes it: the text, or with images the parts,
        each image a {"type": "image"} (where the template writes the image token)."""
        if not self.images():
            return self.text()
        return [{"type": "image"} if part.image() is not None else
                {"type": "text", "text": part.text_of()} for part in self.content or ()]


class ChatRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False  # not in OpenAI's chat API: refused (vLLM's extra), never ignored
    tools: Annotated[list[ToolDef], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # passed to the chat template (enable_thinking=False, say), as vLLM and SGLang take it
    chat_template_kwargs: Annotated[dict[str, Any], Field(max_length=MAX_TEMPLATE_KWARGS)] | None \
        = None
    separate_reasoning: bool = True  # SGLang's: with --reasoning-parser, thinking apart
    # vLLM's: the last message (an assistant's) is continued, not answered (a "prefill")
    continue_final_message: bool = False
    # OpenAI fields this server does not implement: refused by name, never ignored
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None

    def unsupported(self) -> list[str]:
        return [name for name in UNSUPPORTED_CHAT_FIELDS if getattr(self, name) is not None]


UNSUPPORTED_CHAT_FIELDS = ("functions", "function_call", "audio", "modalities", "prediction",
                           "web_search_options")


# --- request -> SamplingParams -----------------------------------------------------------------

_PASSED_THROUGH = ("temperature", "top_p", "top_k", "min_p", "n", "seed", "frequency_penalty",
                   "presence_penalty", "repetition_penalty", "ignore_eos", "min_tokens")


REQUEST_CONSTRAINTS = ("regex", "json_schema", "choices", "ebnf", "lark")


def grammar_syntax(grammar: str) -> str:
    """ "ebnf" for GBNF (rules written `name ::= ...`), else "lark"."""
    return "ebnf" if "::=" in grammar else "lark"


def constraint_fields(fields: SamplingFields) -> dict[str, Any]:
    """The regex / json_schema / choices / ebnf / lark SamplingParams fields a request asks
    for."""
    values = {name: getattr(fields, name) for name in REQUEST_CONSTRAINTS
              if getattr(fields, name) is not None}
    fmt = fields.response_format
    if fmt is None or fmt.type == "text":
        return values
    if values:
        raise APIError(f"response_format and {sorted(values)} both constrain the output: "
                       "give one", param="response_format")
    if fmt.type == "json_object":
        return {"json_schema": {"type": "object"}}
    if fmt.type == "grammar":
        if not isinstance(fmt.grammar, str) or not fmt.grammar.strip():
            raise APIError('response_format of type grammar needs "grammar": the grammar text '
                           "(GBNF or Lark)", param="response_format")
        return {grammar_syntax(fmt.grammar): fmt.grammar}
    schema = (fmt.json_schema or {}).get("schema")
    if not isinstance(schema, dict):
        raise APIError('response_format of type json_schema needs "json_schema": {"name": ..., '
                       '"schema": {...}}', param="response_format")
    return {"json_schema": schema}


def parse_logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if bias is None:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            out[int(key)] = value
        except ValueError:
            raise APIError(f"logit_bias key {key!r} must be a token id (an integer)",
                           param="logit_bias") from None
    return out


def build_sampling_params(values: dict[str, Any]) -> SamplingParams:
    """SamplingParams(**values); its ValueError (which names the field) becomes a 400."""
    try:
        return SamplingParams(**values)
    except (ValueError, TypeError) as exc:
        raise APIError(str(exc), param=param_of(str(exc))) from None


def to_sampling_params(
    fields: SamplingFields,
    max_tokens: int | None,
    logprobs: bool = False,
    top_logprobs: int = 0,
    prompt_logprobs_start: int | None = None,
    constraint: dict[str, Any] | None = None,
) -> SamplingParams:
    """constraint: the constraint fields (regex, tool_calls, reasoning_format, ...) to use
    instead of the request's own (the chat endpoint works them out with its tools)."""
    values: dict[str, Any] = {
        name: getattr(fields, name) for name in _PASSED_THROUGH if getattr(fields, name) is not None
    }
    if fields.stop is not None:
        values["stop"] = fields.stop
    values["logit_bias"] = parse_logit_bias(fields.logit_bias)
    values["max_tokens"] = max_tokens  # None: the runtime's default rule
    values["logprobs"] = logprobs
    values["top_logprobs"] = top_logprobs
    values["prompt_logprobs_start"] = prompt_logprobs_start
    values.update(constraint_fields(fields) if constraint is None else constraint)
    return build_sampling_params(values)


# --- responses ---------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class CompletionLogprobs(BaseModel):
    """The legacy format. With echo the prompt's tokens come first; its first token has None
    for token_logprobs and top_logprobs (nothing precedes it)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)

    def extend(self, other: CompletionLogprobs) -> CompletionLogprobs:
        self.tokens += other.tokens
        self.token_logprobs += other.token_logprobs
        self.top_logprobs += other.top_logprobs
        self.text_offset += other.text_offset
        return self


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobOut(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobOut] = Field(default_factory=list)


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None
    reasoning_content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDeltaOut] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


def finish_reason_out(reason: str | None) -> str | None:
    """The runtime's reasons as clients see them: "error: ..." becomes "error"."""
    if reason is not None and reason.startswith("error"):
        return "error"
    return reason
