"""Anthropic's Messages API shapes (POST /v1/messages, POST /v1/messages/count_tokens): the
request models, their translation into the one chat request every chat surface runs
(ChatRequest), the response and stream-event models, and Anthropic's error shape.

Unknown request fields are ignored (clients send many: metadata, service_tier, ...); fields that
would change the answer and are not implemented here (documents, server tools, citations) are
refused by name with a 400, never ignored. Image blocks (base64 or URL sources) go to the chat
request as image parts (core/image_parts.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from radixrt.runtime.config import (
    MAX_GRAMMAR_CHARS,
    MAX_NAME_CHARS,
    MAX_TOOL_CALL_ID_CHARS,
    MAX_TOOLS,
)
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.core.image_parts import base64_url, chat_content, image_part, text_part
from radixrt.runtime.server.core.typed_union import by_type
from radixrt.runtime.server.openai.openai_protocol import (
    MAX_CONTENT_PARTS,
    ChatMessage,
    ChatRequest,
    ResponseFormat,
)
from radixrt.runtime.server.openai.tool_protocol import (
    MAX_TOOL_NAME_CHARS,
    TOOL_NAME_PATTERN,
    FunctionCallIn,
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    ToolCallIn,
    ToolDef,
)

MAX_STOP_SEQUENCES = 16
# --- requests ----------------------------------------------------------------------------------


class TextBlockIn(BaseModel):
    type: Literal["text"]
    text: str


class ToolUseBlockIn(BaseModel):
    """A call an earlier assistant turn made."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=MAX_TOOL_CALL_ID_CHARS)
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    input: dict[str, Any]


class ToolResultBlockIn(BaseModel):
    """A user turn's answer to a call: its output as text (or text blocks)."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=MAX_TOOL_CALL_ID_CHARS)
    content: str | Annotated[list[TextBlockIn], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    is_error: bool | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            text = self.content or ""
        else:
            text = "".join(block.text for block in self.content)
        return f"Error: {text}" if self.is_error else text


class ThinkingBlockIn(BaseModel):
    """An earlier assistant turn's thinking (templates may drop it)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class ImageSourceIn(BaseModel):
    """{"type": "base64", "media_type", "data"} or {"type": "url", "url"}."""

    type: Literal["base64", "url"]
    media_type: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    data: str | None = None
    url: str | None = None

    def ref(self) -> str:
        """The image as a URL (a base64 source as a data: URL)."""
        given = self.data if self.type == "base64" else self.url
        if not given:
            raise APIError(f"an image source of type {self.type!r} needs "
                           f"{'data' if self.type == 'base64' else 'url'}", param="messages")
        return base64_url(self.media_type or "", given) if self.type == "base64" else given


class ImageBlockIn(BaseModel):
    type: Literal["image"]
    source: ImageSourceIn


class OtherBlockIn(BaseModel):
    """A block of a type this server does not serve (document, server tools): refused."""

    type: str = Field(max_length=MAX_NAME_CHARS)


# A block is validated as the model its type names (so a text block without text says so).
BlockIn = by_type({"text": TextBlockIn, "tool_use": ToolUseBlockIn,
                   "tool_result": ToolResultBlockIn, "thinking": ThinkingBlockIn,
                   "image": ImageBlockIn}, OtherBlockIn)


class MessageIn(BaseModel):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[BlockIn], Field(max_length=MAX_CONTENT_PARTS)]


class ToolIn(BaseModel):
    """A client tool; server tools (web_search, bash, ...) have a `type` and are refused."""

    name: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS, pattern=TOOL_NAME_PATTERN)
    description: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)
    input_schema: dict[str, Any]
    type: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class ToolChoiceIn(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, max_length=MAX_TOOL_NAME_CHARS)
    disable_parallel_tool_use: bool | None = None


class ThinkingIn(BaseModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class OutputFormat(BaseModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """format: the output is a JSON document valid under the schema (the grammar makes it so);
    effort is accepted and means nothing to a model without an effort setting."""

    format: OutputFormat | None = None
    effort: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class Metadata(BaseModel):
    user_id: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class CountTokensRequest(BaseModel):
    model: str = Field(max_length=MAX_NAME_CHARS)
    messages: list[MessageIn]
    system: str | Annotated[list[TextBlockIn], Field(max_length=MAX_CONTENT_PARTS)] | None = None
    tools: Annotated[list[ToolIn], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingIn | None = None

    def to_chat(self, **sampling: Any) -> ChatRequest:
        """The one chat request this becomes (ValueError-free: a bad shape is an APIError)."""
        messages = self.system_messages() + [m for i, message in enumerate(self.messages)
                                             for m in chat_messages(message, i)]
        kwargs: dict[str, Any] = {}
        if self.thinking is not None:  # the templates that think read enable_thinking
            kwargs["enable_thinking"] = self.thinking.type != "disabled"
        last = self.messages[-1] if self.messages else None
        return ChatRequest(
            model=self.model, messages=messages, tools=self.chat_tools(),
            chat_template_kwargs=kwargs or None,
            # a final assistant turn is continued (Anthropic's prefill)
            continue_final_message=last is not None and last.role == "assistant",
            **self.chat_tool_choice(), **sampling)

    def system_messages(self) -> list[ChatMessage]:
        if self.system is None:
            return []
        text = self.system if isinstance(self.system, str) else \
            "".join(block.text for block in self.system)
        return [ChatMessage(role="system", content=text)]

    def chat_tools(self) -> list[ToolDef] | None:
        if not self.tools:
            return None
        for tool in self.tools:
            if tool.type not in (None, "custom"):
                raise APIError(f"tool {tool.name!r} of type {tool.type!r}: server tools are not "
                               "served here; give client tools (name, description, "
                               "input_schema)", param="tools")
        return [ToolDef(type="function", function=FunctionDef(
            name=t.name, description=t.description, parameters=t.input_schema))
            for t in self.tools]

    def chat_tool_choice(self) -> dict[str, Any]:
        """tool_choice and parallel_tool_calls of the chat request: auto, any (= required),
        tool (one named tool; several calls of it unless disable_parallel_tool_use), none."""
        choice = self.tool_choice
        if choice is None:
            return {}
        if choice.type == "tool" and not choice.name:
            raise APIError('tool_choice {"type": "tool"} needs the tool\'s "name"',
                           param="tool_choice")
        if choice.type == "tool":
            named = NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
            return {"tool_choice": named,
                    "parallel_tool_calls": not choice.disable_parallel_tool_use}
        out: dict[str, Any] = {"tool_choice": "required" if choice.type == "any"
                               else choice.type}
        if choice.disable_parallel_tool_use and choice.type != "none":
            out["parallel_tool_calls"] = False
        return out


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
    # radixrt's extras, as on the OpenAI routes: lower = more urgent; requests with different
    # cache_salt never share cached KV; seconds it may wait in the queue
    priority: int | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    timeout: float | None = None

    def to_chat_request(self) -> ChatRequest:
        if self.max_tokens < 1:
            raise APIError(f"max_tokens={self.max_tokens} is invalid: must be >= 1",
                           param="max_tokens")
        fields = {name: getattr(self, name) for name in ("temperature", "top_p", "top_k",
                                                         "priority", "cache_salt", "timeout")
                  if getattr(self, name) is not None}
        user = self.metadata.user_id if self.metadata is not None else None
        fmt = self.output_config.format if self.output_config is not None else None
        if fmt is not None:
            fields["response_format"] = ResponseFormat(
                type="json_schema", json_schema={"name": "output", "schema": fmt.schema_})
        return self.to_chat(max_tokens=self.max_tokens, stop=self.stop_sequences,
                            stream=self.stream, user=user, **fields)


def chat_messages(message: MessageIn, index: int) -> list[ChatMessage]:
    """One Anthropic turn as chat messages: a user turn's tool_result blocks become tool
    messages (before its text, as Anthropic orders them); an assistant turn's tool_use blocks
    become its tool_calls and its thinking its reasoning_content."""
    if isinstance(message.content, str):
        return [ChatMessage(role=message.role, content=message.content)]
    texts: list[dict[str, Any]] = []  # text and image parts
    calls: list[ToolCallIn] = []
    results: list[ChatMessage] = []
    thinking: list[str] = []
    for block in message.content:
        where = f"messages[{index}]: a block of type {block.type!r}"
        if isinstance(block, TextBlockIn):
            texts.append(text_part(block.text))
        elif isinstance(block, ImageBlockIn) and message.role == "user":
            texts.append(image_part(block.source.ref()))
        elif isinstance(block, ToolUseBlockIn) and message.role == "assistant":
            # compact, as the grammar writes calls: the turn renders as the model wrote it
            # (so the next turn's prompt is a cache hit)
            arguments = json.dumps(block.input, separators=(",", ":"), ensure_ascii=False)
            if len(arguments) > MAX_GRAMMAR_CHARS or len(calls) == MAX_TOOLS:
                raise APIError(f"{where}: a turn has at most {MAX_TOOLS} tool_use blocks, each "
                               f"input at most {MAX_GRAMMAR_CHARS} characters of JSON",
                               param="messages")
            calls.append(ToolCallIn(id=block.id, function=FunctionCallIn(
                name=block.name, arguments=arguments)))
        elif isinstance(block, ToolResultBlockIn) and message.role == "user":
            results.append(ChatMessage(role="tool", content=block.text(),
                                       tool_call_id=block.tool_use_id))
        elif isinstance(block, ThinkingBlockIn) and message.role == "assistant":
            thinking.append(block.thinking)
        elif isinstance(block, OtherBlockIn):
            raise APIError(f"{where} is not supported: send text, image, tool_use and "
                           "tool_result blocks", param="messages")
        else:
            raise APIError(f"{where} is not valid in a {message.role} turn", param="messages")
    out = list(results)
    if texts or calls or not results:
        out.append(ChatMessage(role=message.role, content=chat_content(texts) if texts or not calls
                               else None, tool_calls=calls or None,
                               reasoning_content="".join(thinking) if thinking else None))
    return out


# --- responses ---------------------------------------------------------------------------------


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # no signature: thinking is not signed here


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(BaseModel):
    """input_tokens counts the prompt's tokens not read from the cache (Anthropic's: the total
    is input_tokens + cache_read_input_tokens + cache_creation_input_tokens)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int, output_tokens: int, cached_tokens: int) -> MessageUsage:
        return cls(input_tokens=prompt_tokens - cached_tokens, output_tokens=output_tokens,
                   cache_read_input_tokens=cached_tokens)


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessageOut(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ThinkingBlock | ToolUseBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage


class CountTokensOut(BaseModel):
    input_tokens: int


def stop_reason_of(finish_reason: str | None, matched_stop: str | None, has_calls: bool
                   ) -> tuple[StopReason | None, str | None]:
    """(stop_reason, stop_sequence) of the runtime's finish reason."""
    if finish_reason is None:
        return None, None
    if finish_reason == "length":
        return "max_tokens", None
    if has_calls:
        return "tool_use", None
    if matched_stop is not None:
        return "stop_sequence", matched_stop
    return "end_turn", None  # "stop" (end of sequence), "abort"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's tool_use.input is (the grammar makes them
    an object; an unenforced call that is not one is kept whole under "arguments")."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}
