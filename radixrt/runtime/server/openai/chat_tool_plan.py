"""What a chat request's tools and reasoning ask of the runtime: the server's chat features
(--tool-call-parser, --reasoning-parser, enforcement), and per request the tool-call grammar,
the tools for the template and how the output is to be parsed.

tool_choice:
- "none": the tools stay in the prompt (so its prefix is the same as the other turns'), and the
  grammar lets no call start; the output is plain content.
- "auto" (the default with tools): free text, and from the format's opener on, a well-formed
  call of one of the tools (a trigger in the grammar).
- "required": one or more calls, nothing else (parallel_tool_calls=false: one call);
  {"type": "function", "function": {"name": n}}: exactly one call, of that tool (as OpenAI's
  guide says of a forced function, and as vLLM and SGLang constrain it), whatever
  parallel_tool_calls says; on /v1/messages (named_parallel) Anthropic's {"type": "tool"} makes
  several unless disable_parallel_tool_use.
With enforcement off (--no-tool-call-enforcement, for comparison) no grammar is added and the
output is only parsed.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any

from radixrt.runtime.config import MAX_NAME_CHARS
from radixrt.runtime.constrained.structural import (
    ReasoningFormat,
    ToolCallSpec,
    ToolFormat,
    reasoning_format,
    tool_format,
)
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.openai.openai_protocol import ChatRequest
from radixrt.runtime.server.openai.tool_protocol import NamedToolChoice
from radixrt.runtime.tokenizer.chat_tool_prompts import template_renders_tools

_RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "tokenize", "add_generation_prompt",
                             "conversation", "documents", "return_dict")


@dataclass(frozen=True)
class ChatFeatures:
    """The server's: how tool calls are written and parsed, whether the grammar enforces them,
    and the reasoning format (None: outputs have no separate thinking)."""

    tool_format: ToolFormat
    reasoning: ReasoningFormat | None = None
    enforce_tool_calls: bool = True
    native_tools: bool = False  # the chat template renders tools itself
    # apply_chat_template's own parameters: chat_template_kwargs may not set them
    reserved_kwargs: frozenset[str] = frozenset(_RESERVED_TEMPLATE_KWARGS)

    @classmethod
    def of(cls, tokenizer: Any, tool_call_parser: str = "auto",
           reasoning_parser: str | None = None, enforce_tool_calls: bool = True) -> ChatFeatures:
        """ValueError naming the known parsers for an unknown one."""
        if tool_call_parser == "auto":
            tool_call_parser = parser_of_template(getattr(tokenizer, "chat_template", None))
        reasoning = reasoning_format(reasoning_parser) if reasoning_parser else None
        return cls(tool_format(tool_call_parser), reasoning, enforce_tool_calls,
                   template_renders_tools(tokenizer), template_parameters(tokenizer))

    def info(self) -> dict[str, Any]:
        return {"tool_call_parser": self.tool_format.name,
                "reasoning_parser": self.reasoning.name if self.reasoning else None,
                "tool_call_enforcement": self.enforce_tool_calls,
                "template_renders_tools": self.native_tools}


def template_parameters(tokenizer: Any) -> frozenset[str]:
    """The names apply_chat_template takes itself (chat_template, padding, max_length, ...):
    a request may not pass them as template variables."""
    try:
        names = inspect.signature(tokenizer.apply_chat_template).parameters
    except (TypeError, ValueError, AttributeError):
        names = {}
    return frozenset(_RESERVED_TEMPLATE_KWARGS) | {n for n, p in names.items()
                                                   if p.kind is not p.VAR_KEYWORD}


def parser_of_template(template: Any) -> str:
    """The tool-call format a chat template writes calls in: Llama 3's JSON calls where the
    template speaks of <|python_tag|> or ipython, else Hermes (also the built-in prompt's)."""
    text = template if isinstance(template, str) else str(template or "")
    if "<|python_tag|>" in text or "ipython" in text:
        return "llama3_json"
    return "hermes"


@dataclass(frozen=True)
class ChatToolPlan:
    """One request's: the tools for the template, the constraint fields for SamplingParams,
    whether the output is parsed for calls, and the reasoning format to split off."""

    tools: list[dict[str, Any]] | None
    constraint: dict[str, Any]
    parse_calls: bool
    reasoning: ReasoningFormat | None
    template_kwargs: dict[str, Any]


def plan_chat(body: ChatRequest, features: ChatFeatures, other_constraint: dict[str, Any],
              named_parallel: bool = False) -> ChatToolPlan:
    """other_constraint: the regex / json_schema / choices / response_format fields given;
    named_parallel: a named tool choice may make several calls (of that tool)."""
    unsupported = body.unsupported()
    if unsupported:
        hint = " (use tools and tool_choice)" if {"functions", "function_call"} & \
            set(unsupported) else ""
        raise APIError(f"{', '.join(unsupported)} not supported on this server{hint}",
                       param=unsupported[0])
    kwargs = check_template_kwargs(body.chat_template_kwargs, features.reserved_kwargs)
    check_conversation(body)
    # a continued assistant turn (a prefill) is answer text, never the thinking
    reasoning = features.reasoning if body.separate_reasoning and not \
        body.continue_final_message else None
    if not body.tools:
        if body.tool_choice is not None and body.tool_choice != "none":
            raise APIError("tool_choice needs tools: give the tools the model may call",
                           param="tool_choice")
        if body.parallel_tool_calls is not None:
            raise APIError("parallel_tool_calls needs tools", param="parallel_tool_calls")
        return ChatToolPlan(None, with_reasoning(other_constraint, reasoning), False,
                            reasoning, kwargs)
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    names = [t.function.name for t in body.tools]
    if len(set(names)) != len(names):
        raise APIError(f"tools has duplicate function names: {sorted(names)}", param="tools")
    choice = body.tool_choice or "auto"
    named = isinstance(choice, NamedToolChoice)  # a forced function: one call of it
    if choice == "none":
        mode, allowed = "none", []
    elif named:
        if choice.function.name not in names:
            raise APIError(f"tool_choice names function {choice.function.name!r}, which is not "
                           f"in tools: use one of {names}", param="tool_choice")
        mode, allowed = "required", [t for t in body.tools if t.function.name ==
                                     choice.function.name]
    else:
        mode, allowed = choice, list(body.tools)
    if other_constraint and mode != "none":
        raise APIError(f"tools (tool_choice={mode!r}) and {sorted(other_constraint)} both "
                       'constrain the output: give one, or send tool_choice="none"',
                       param="tools")
    constraint = dict(other_constraint)
    # none: a grammar where the format has an opener to keep out; Llama-3 JSON has none (and
    # its output is not parsed then)
    if mode != "none" or (not other_constraint and features.tool_format.trigger):
        spec = ToolCallSpec(
            features.tool_format,
            tuple((t.function.name, _schema_text(t.function.parameters)) for t in allowed),
            mode, body.parallel_tool_calls is not False and (named_parallel or not named))
        if features.enforce_tool_calls:
            constraint = {"tool_calls": spec.to_json()}
    return ChatToolPlan(tools, with_reasoning(constraint, reasoning), mode != "none", reasoning,
                        kwargs)


def with_reasoning(constraint: dict[str, Any], reasoning: ReasoningFormat | None
                   ) -> dict[str, Any]:
    """The constraint applies after the thinking (SamplingParams.reasoning_format)."""
    if not constraint or reasoning is None:
        return constraint
    return {**constraint, "reasoning_format": reasoning.name}


def check_template_kwargs(kwargs: dict[str, Any] | None, reserved_names: frozenset[str]
                          ) -> dict[str, Any]:
    """Template variables (enable_thinking, ...): names, plain short values; never one of
    apply_chat_template's own parameters (the template itself, padding, truncation, ...)."""
    if not kwargs:
        return {}
    reserved = sorted(set(kwargs) & reserved_names)
    if reserved:
        raise APIError(f"chat_template_kwargs may not set {reserved}: the server passes them",
                       param="chat_template_kwargs")
    bad = sorted(k for k, v in kwargs.items() if not k.isidentifier()
                 or not isinstance(v, (str, int, float, bool, type(None)))
                 or (isinstance(v, str) and len(v) > MAX_NAME_CHARS))
    if bad:
        raise APIError(f"chat_template_kwargs {bad}: keys must be names and values plain "
                       f"strings (at most {MAX_NAME_CHARS} characters), numbers, booleans or "
                       "null", param="chat_template_kwargs")
    return dict(kwargs)


def check_conversation(body: ChatRequest) -> None:
    """The follow-up turn's shape: calls only on assistant turns; a null content only where the
    turn has calls; each tool turn answers a call an earlier turn made."""
    ids: set[str] = set()
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        if message.tool_calls and message.role != "assistant":
            raise APIError(f"{where}: only assistant messages carry tool_calls",
                           param="messages")
        if message.content is None and not (message.role == "assistant" and message.tool_calls):
            raise APIError(f"{where}: content is null; only an assistant message with "
                           "tool_calls may leave it out", param="messages")
        for call in message.tool_calls or ():
            ids.add(call.id)
        if message.role == "tool":
            if message.tool_call_id is None:
                raise APIError(f"{where}: a tool message needs tool_call_id (the id of the call "
                               "it answers)", param="messages")
            if message.tool_call_id not in ids:
                raise APIError(f"{where}: tool_call_id {message.tool_call_id!r} answers no "
                               "earlier assistant tool call", param="messages")
        message.text()  # content parts other than text and images are refused here
        if message.role != "user" and message.images():
            raise APIError(f"{where}: only user messages carry images", param="messages")
    last = body.messages[-1] if body.messages else None
    if body.continue_final_message and (last is None or last.role != "assistant"
                                        or last.tool_calls or not last.text()):
        raise APIError("continue_final_message needs the last message to be an assistant's text "
                       "(without tool calls) for the model to continue", param="messages")


def template_messages(body: ChatRequest) -> list[dict[str, Any]]:
    """The conversation as chat-template dicts ("developer" is the template's "system")."""
    out = []
    for message in body.messages:
        item: dict[str, Any] = {"role": "system" if message.role == "developer"
                                else message.role, "content": message.template_content()}
        if message.tool_calls:
            item["tool_calls"] = [c.model_dump() for c in message.tool_calls]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        if message.name is not None and message.role == "tool":  # the function's name
            item["name"] = message.name
        if message.reasoning_content is not None:
            item["reasoning_content"] = message.reasoning_content
        out.append(item)
    return out


def _schema_text(parameters: dict[str, Any] | None) -> str:
    return json.dumps(parameters if parameters is not None else {"type": "object"},
                      sort_keys=True)
