"""Chat prompts with tools: the model's own chat template where it renders tools, else the
built-in tool prompt (Hermes style) around a template that does not.

A template renders tools when `apply_chat_template(..., tools=[...])` puts a tool's name into
the prompt (Qwen 2.5 / 3, Hermes, Llama 3.1 do; SmolLM2's does not). Then the conversation goes
to the template as it is: assistant turns with `tool_calls` (arguments as objects, as
transformers' templates expect them), `tool` turns with their `tool_call_id`.

Otherwise the built-in prompt stands in, so tools work on every model:
- the tools and the call format are described in the system message (added, or appended to
  the conversation's own system message);
- an assistant turn's calls are written into its content in the server's tool-call format,
  exactly as the grammar makes the model write them, so the next turn's prompt repeats the
  previous output and the radix cache hits on it;
- consecutive `tool` turns become one user turn of `<tool_response>` blocks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError

from radixrt.runtime.constrained.structural import ToolFormat
from radixrt.runtime.tokenizer.chat_roles import chat_roles

TOOL_RESPONSE_OPENER = "<tool_response>"  # a tool's result, in the built-in tool prompt
TOOL_RESPONSE_CLOSER = "</tool_response>"

_PROBE_NAME = "rx_probe_tool_name"
_PROBE_TOOL = {"type": "function", "function": {
    "name": _PROBE_NAME, "description": "probe", "parameters": {"type": "object"}}}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes the tools it is given into the prompt."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                             tools=[_PROBE_TOOL], tokenize=False,
                                             add_generation_prompt=True)
    except (TemplateError, TypeError, ValueError, KeyError):
        return False
    return _PROBE_NAME in str(text)


def builtin_tool_prompt(fmt: ToolFormat, tools: Sequence[Mapping[str, Any]] | None) -> str:
    """The system text that describes `tools` (OpenAI tool dicts) and the call format; with
    tools None, "{tools}" stands where they would be listed (for DSL clients)."""
    listing = "{tools}" if tools is None else "\n".join(json.dumps(tool, ensure_ascii=False)
                                                       for tool in tools)
    example = fmt.block("<function-name>", "<arguments-json-object>")
    where = ("within <tools></tools> XML tags" if fmt.opener else "as JSON, one per line")
    listing = f"<tools>\n{listing}\n</tools>" if fmt.opener else listing
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures {where}:\n{listing}\n\n"
        "For each function call, return a JSON object with the function name and its "
        f"arguments in this form:\n{example}"
    )


def builtin_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                     fmt: ToolFormat) -> list[dict[str, Any]]:
    """The conversation rewritten for a template that knows nothing of tools."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = [fmt.block(c["function"]["name"], _arguments_text(c["function"]))
                     for c in message["tool_calls"]]
            joined = fmt.separator.join(calls)
            out.append({"role": "assistant", "content": content + joined if content
                        else joined})
        elif role == "tool":
            block = f"{TOOL_RESPONSE_OPENER}\n{content}\n{TOOL_RESPONSE_CLOSER}"
            if out and out[-1].get("rx_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "rx_tool_results": True})
        else:
            out.append({"role": role, "content": content})
    for message in out:
        message.pop("rx_tool_results", None)
    if tools:
        prompt = builtin_tool_prompt(fmt, tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] \
                else prompt
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def native_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The conversation for a template that renders tools: calls' arguments as objects."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**c, "function": {"name": c["function"]["name"],
                                   "arguments": _arguments_value(c["function"])}}
                for c in message["tool_calls"]]
        if message.get("content") is None:
            message["content"] = ""
        out.append(message)
    return out


def dsl_chat_info(tokenizer: Any, fmt: ToolFormat) -> dict[str, Any]:
    """What DSL clients build chat prompts from: each role's markers (chat_roles), a "tool"
    role (a user turn around a <tool_response> block, as the built-in prompt and the Qwen
    templates write a tool's result) and the tool prompt with "{tools}" to fill in."""
    chat = chat_roles(tokenizer)
    user = chat["roles"].get("user")
    if user is not None:
        chat["roles"]["tool"] = [f"{user[0]}{TOOL_RESPONSE_OPENER}\n",
                                 f"\n{TOOL_RESPONSE_CLOSER}{user[1]}"]
    chat["tool_prompt"] = builtin_tool_prompt(fmt, None)
    return chat


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None = None,
                template_kwargs: Mapping[str, Any] | None = None,
                tool_format: ToolFormat | None = None,
                native_tools: bool | None = None, continue_final: bool = False) -> list[int]:
    """Token ids of the conversation with the generation prompt. tools: OpenAI tool dicts
    ({"type": "function", "function": {...}}); tool_format: how calls are written for the
    built-in prompt; native_tools: whether the template renders tools (probed if None);
    continue_final: the last (assistant) message is left open for the model to continue,
    without a generation prompt. Raises ValueError when the template refuses the
    conversation."""
    kwargs = dict(template_kwargs or {})
    uses_tools = bool(tools) or any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if uses_tools:
        if native_tools is None:
            native_tools = template_renders_tools(tokenizer)
        if native_tools:
            messages = native_messages(messages)
            if tools:
                kwargs["tools"] = list(tools)
        elif tool_format is None:
            raise ValueError("tool calls in the conversation need a tool-call format")
        else:
            messages = builtin_messages(messages, tools or (), tool_format)
    try:
        ids = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=True,
                                            add_generation_prompt=not continue_final,
                                            continue_final_message=continue_final, **kwargs)
    except TemplateError as exc:
        raise ValueError(f"the chat template refused the conversation: {exc}") from None
    if isinstance(ids, Mapping):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def _arguments_text(function: Mapping[str, Any]) -> str:
    args = function.get("arguments", "{}")
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _arguments_value(function: Mapping[str, Any]) -> Any:
    args = function.get("arguments", "{}")
    if not isinstance(args, str):
        return args
    try:
        return json.loads(args)
    except json.JSONDecodeError:
        return args
