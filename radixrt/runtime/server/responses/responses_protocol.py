"""OpenAI's Responses API shapes (POST /v1/responses and its GET / DELETE / cancel): the request
model, its translation into the one chat request every chat surface runs (ChatRequest), and the
response object and output items.

Unknown request fields are ignored (clients send many: include, truncation, prompt_cache_key,
...); fields that would change the answer and are not implemented here (background mode,
conversations, stored prompts, hosted tools, files) are refused by name with a 400; input_image
parts (a data: or http(s) image_url) go to the chat request as image parts.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from radixrt.runtime.config import (
    MAX_GRAMMAR_CHARS,
    MAX_NAME_CHARS,
    MAX_TOOL_CALL_ID_CHARS,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
)
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.core.image_parts import chat_content, image_part, text_part
from radixrt.runtime.server.core.typed_union import by_type
from radixrt.runtime.server.openai.openai_protocol import (
    MAX_CONTENT_PARTS,
    ChatMessage,
    ChatRequest,
    ResponseFormat,
    TokenLogprobOut,
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

MAX_INPUT_ITEMS = 1024
MAX_METADATA_KEYS = 16  # OpenAI's: 16 pairs, keys of 64 and values of 512 characters
MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 64, 512
RESPONSE_ID_CHARS = 128  # the longest id a path may name
TEXT_PARTS = ("input_text", "output_text", "text")

# --- requests ----------------------------------------------------------------------------------


class ContentPartIn(BaseModel):
    type: str = Field(max_length=MAX_NAME_CHARS)
    text: str | None = None
    image_url: str | None = None  # input_image's (its detail is accepted and ignored)


class MessageItem(BaseModel):
    """A message (type may be left out: the "easy" input message)."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | Annotated[list[ContentPartIn], Field(max_length=MAX_CONTENT_PARTS)]
    id: str | None = Field(default=None, max_length=RESPONSE_ID_CHARS)

    def chat_content(self, where: str) -> str | list[dict[str, Any]]:
        """Its content as the chat message's: text, with images image parts."""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type == "input_image" and part.image_url:
                parts.append(image_part(part.image_url))
            elif part.type in TEXT_PARTS and part.text is not None:
                parts.append(text_part(part.text))
            else:
                raise APIError(f"{where}: a content part of type {part.type!r} is not supported "
                               "(an input_image needs image_url: file_id is not served); send "
                               "input_text and input_image parts", param="input")
        return chat_content(parts)


class FunctionCallItem(BaseModel):
    """A call an earlier response made (sent back with its output)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=MAX_TOOL_CALL_ID_CHARS)
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arguments: str = Field(max_length=MAX_GRAMMAR_CHARS)
    id: str | None = Field(default=None, max_length=RESPONSE_ID_CHARS)


class FunctionCallOutputItem(BaseModel):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=MAX_TOOL_CALL_ID_CHARS)
    output: str | Annotated[list[ContentPartIn], Field(max_length=MAX_CONTENT_PARTS)]
    id: str | None = Field(default=None, max_length=RESPONSE_ID_CHARS)

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text or "" for part in self.output if part.type in TEXT_PARTS)


class ReasoningItem(BaseModel):
    """An earlier response's reasoning: its text goes with the assistant turn after it."""

    type: Literal["reasoning"]
    id: str | None = Field(default=None, max_length=RESPONSE_ID_CHARS)
    summary: Annotated[list[ContentPartIn], Field(max_length=MAX_CONTENT_PARTS)] = []
    content: Annotated[list[ContentPartIn], Field(max_length=MAX_CONTENT_PARTS)] | None = None

    def text(self) -> str:
        parts = self.content if self.content else self.summary
        return "".join(part.text or "" for part in parts)


class OtherItem(BaseModel):
    type: str = Field(max_length=MAX_NAME_CHARS)


ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
# An item without a type is a message (the "easy" input message).
InputItem = by_type({"message": MessageItem, "function_call": FunctionCallItem,
                     "function_call_output": FunctionCallOutputItem,
                     "reasoning": ReasoningItem}, OtherItem, absent="message")


class FunctionToolIn(BaseModel):
    """A function tool; hosted tools (web_search, file_search, ...) have other types: refused."""

    type: str = Field(max_length=MAX_NAME_CHARS)
    name: str | None = Field(default=None, max_length=MAX_TOOL_NAME_CHARS,
                             pattern=TOOL_NAME_PATTERN)
    description: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedToolChoiceIn(BaseModel):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)


class TextFormat(BaseModel):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)


class TextConfig(BaseModel):
    format: TextFormat | None = None
    verbosity: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


class ReasoningConfig(BaseModel):
    effort: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    summary: str | None = Field(default=None, max_length=MAX_NAME_CHARS)


Metadata = Annotated[dict[Annotated[str, Field(max_length=MAX_METADATA_KEY_CHARS)],
                          Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)]],
                     Field(max_length=MAX_METADATA_KEYS)]


class ResponsesRequest(BaseModel):
    model: str = Field(max_length=MAX_NAME_CHARS)
    input: str | Annotated[list[InputItem], Field(max_length=MAX_INPUT_ITEMS)]
    instructions: str | None = None
    tools: Annotated[list[FunctionToolIn], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoiceIn | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(default=None, max_length=RESPONSE_ID_CHARS)
    metadata: Metadata | None = None
    user: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    truncation: Literal["auto", "disabled"] | None = None
    # radixrt's extras, as on the other routes
    priority: int | None = None
    cache_salt: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    timeout: float | None = None
    # not implemented here: refused by name, never ignored
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None

    def check(self) -> None:
        if self.background:
            raise APIError("background responses are not supported on this server: send "
                           "background=false (or stream=true)", param="background")
        for name in ("conversation", "prompt"):
            if getattr(self, name) is not None:
                raise APIError(f"{name} is not supported on this server (use "
                               "previous_response_id to continue a conversation)", param=name)
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise APIError(f"max_output_tokens={self.max_output_tokens} is invalid: must be "
                           ">= 1", param="max_output_tokens")

    def input_messages(self) -> list[ChatMessage]:
        """This request's input as chat messages: function calls join the assistant turn
        before them (or make one), outputs become tool messages, reasoning goes with the next
        assistant turn."""
        if isinstance(self.input, str):
            return [ChatMessage(role="user", content=self.input)]
        out: list[ChatMessage] = []
        thinking: str | None = None
        for i, item in enumerate(self.input):
            where = f"input[{i}]"
            if isinstance(item, MessageItem):
                out.append(ChatMessage(role=item.role, content=item.chat_content(where),
                                       reasoning_content=thinking
                                       if item.role == "assistant" else None))
                thinking = None if item.role == "assistant" else thinking
            elif isinstance(item, FunctionCallItem):
                call = ToolCallIn(id=item.call_id, function=FunctionCallIn(
                    name=item.name, arguments=item.arguments))
                last = out[-1] if out else None
                if last is not None and last.role == "assistant" and last.tool_calls is not None:
                    if len(last.tool_calls) == MAX_TOOLS:
                        raise APIError(f"{where}: at most {MAX_TOOLS} function_call items "
                                       "follow one another (one assistant turn's calls)",
                                       param="input")
                    last.tool_calls.append(call)
                elif last is not None and last.role == "assistant" and not thinking:
                    last.tool_calls = [call]
                else:
                    out.append(ChatMessage(role="assistant", content=None, tool_calls=[call],
                                           reasoning_content=thinking))
                    thinking = None
            elif isinstance(item, FunctionCallOutputItem):
                out.append(ChatMessage(role="tool", content=item.text(),
                                       tool_call_id=item.call_id))
            elif isinstance(item, ReasoningItem):
                thinking = (thinking or "") + item.text()
            else:
                raise APIError(f"{where}: an item of type {item.type!r} is not supported: send "
                               f"{', '.join(ITEM_TYPES)} items", param="input")
        return out

    def chat_tools(self) -> tuple[list[ToolDef] | None, dict[str, Any]]:
        """The chat request's tools, and its tool_choice / parallel_tool_calls."""
        choice: dict[str, Any] = {}
        if isinstance(self.tool_choice, NamedToolChoiceIn):
            choice["tool_choice"] = NamedToolChoice(
                type="function", function=NamedFunction(name=self.tool_choice.name))
        elif self.tool_choice is not None:
            choice["tool_choice"] = self.tool_choice
        if self.parallel_tool_calls is not None:
            choice["parallel_tool_calls"] = self.parallel_tool_calls
        if not self.tools:
            return None, choice
        tools = []
        for tool in self.tools:
            if tool.type != "function" or tool.name is None:
                raise APIError(f"a tool of type {tool.type!r} is not served here: give function "
                               "tools ({\"type\": \"function\", \"name\": ..., \"parameters\": "
                               "{...}})", param="tools")
            tools.append(ToolDef(type="function", function=FunctionDef(
                name=tool.name, description=tool.description, parameters=tool.parameters)))
        return tools, choice

    def response_format(self) -> ResponseFormat | None:
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return ResponseFormat(type="json_object")
        if fmt.schema_ is None:
            raise APIError('text.format of type json_schema needs "schema"', param="text")
        return ResponseFormat(type="json_schema",
                              json_schema={"name": fmt.name or "output", "schema": fmt.schema_})

    def to_chat_request(self, earlier: list[ChatMessage]) -> ChatRequest:
        """The chat request of this turn: the instructions (not carried over from earlier
        turns, as OpenAI's), the earlier turns' messages, then this input."""
        self.check()
        system = [ChatMessage(role="system", content=self.instructions)] \
            if self.instructions is not None else []
        tools, choice = self.chat_tools()
        kwargs: dict[str, Any] = {}
        if self.reasoning is not None and self.reasoning.effort is not None:
            # the templates that think read enable_thinking
            kwargs["enable_thinking"] = self.reasoning.effort not in ("none", "minimal")
        fields = {name: getattr(self, name) for name in ("temperature", "top_p", "priority",
                                                         "cache_salt", "timeout", "user")
                  if getattr(self, name) is not None}
        return ChatRequest(
            model=self.model, messages=[*system, *earlier, *self.input_messages()],
            tools=tools, max_tokens=self.max_output_tokens, stream=self.stream,
            response_format=self.response_format(), chat_template_kwargs=kwargs or None,
            logprobs=self.top_logprobs is not None, top_logprobs=self.top_logprobs,
            **choice, **fields)


# --- responses ---------------------------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[TokenLogprobOut] | None = None


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = OutputMessage | OutputFunctionCall | OutputReasoning


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, output_tokens: int, cached_tokens: int,
           reasoning_tokens: int = 0) -> ResponseUsage:
        return cls(input_tokens=prompt_tokens,
                   input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens),
                   output_tokens=output_tokens,
                   output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens),
                   total_tokens=prompt_tokens + output_tokens)


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: float = Field(default_factory=time.time)
    status: Literal["in_progress", "completed", "incomplete", "cancelled", "failed"]
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    incomplete_details: IncompleteDetails | None = None
    error: dict[str, Any] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool = True
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    metadata: dict[str, str] = Field(default_factory=dict)
    usage: ResponseUsage | None = None

    @classmethod
    def start(cls, rid: str, body: ResponsesRequest) -> ResponseObject:
        """The response as created (in progress), echoing the request's settings."""
        return cls(
            id=rid, status="in_progress", model=body.model, instructions=body.instructions,
            tools=[t.model_dump(exclude_none=True) for t in body.tools or ()],
            tool_choice=body.tool_choice.model_dump() if isinstance(
                body.tool_choice, NamedToolChoiceIn) else body.tool_choice or "auto",
            parallel_tool_calls=body.parallel_tool_calls is not False,
            temperature=body.temperature, top_p=body.top_p,
            max_output_tokens=body.max_output_tokens,
            previous_response_id=body.previous_response_id, store=body.store,
            text=body.text.model_dump(exclude_none=True, by_alias=True)
            if body.text is not None and body.text.format is not None
            else {"format": {"type": "text"}},
            metadata=body.metadata or {})


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True
