"""OpenAI's shapes of tools on /v1/chat/completions: the tools a request offers, the choice it
makes of them, the calls earlier turns made (sent back), and the calls a response returns, whole
or streamed. openai_protocol.py's chat request and response carry them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from radixrt.runtime.config import MAX_GRAMMAR_CHARS, MAX_NAME_CHARS, MAX_TOOL_CALL_ID_CHARS

MAX_TOOL_NAME_CHARS = 64  # OpenAI's limit on a function's name
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.\-]+$"  # OpenAI's characters (and dots)

# --- requests ----------------------------------------------------------------------------------


class FunctionCallIn(BaseModel):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arguments: str = Field(max_length=MAX_GRAMMAR_CHARS)


class ToolCallIn(BaseModel):
    """A call an earlier assistant turn made (sent back in the conversation)."""

    id: str = Field(min_length=1, max_length=MAX_TOOL_CALL_ID_CHARS)
    type: Literal["function"] = "function"
    function: FunctionCallIn


class FunctionDef(BaseModel):
    name: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS, pattern=TOOL_NAME_PATTERN)
    description: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # calls are always enforced here (see tool_choice)


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


# --- responses ---------------------------------------------------------------------------------


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class FunctionDeltaOut(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDeltaOut(BaseModel):
    """OpenAI's streamed call: id, type and the name in a call's first delta, then fragments
    of its arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDeltaOut
