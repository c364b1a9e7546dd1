"""Tools for gen(tools=...): JSON-schema function tools from dicts or plain Python functions,
the spec the runtime's grammar enforces, and the calls a gen made.

A Python function becomes a tool from its signature: each parameter's type hint gives its JSON
type (str, int, float, bool, list[...], dict, Literal[...], Optional[...]), parameters without
defaults are required, and the docstring's first paragraph describes the tool; an "Args:"
section (Google style) describes the parameters.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_JSON_TYPES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"},
    bool: {"type": "boolean"}, dict: {"type": "object"}, list: {"type": "array"},
}
TOOL_CHOICES = ("required", "auto")


@dataclass(frozen=True)
class ToolCall:
    """One call a gen(tools=...) made: the tool's name and its arguments (parsed JSON)."""

    name: str
    arguments: Any  # a dict for the usual {"type": "object"} parameters

    def run(self, tools: Sequence[Any]) -> Any:
        """Call the Python function of that name among `tools` with the arguments."""
        for tool in tools:
            if callable(tool) and getattr(tool, "__name__", None) == self.name:
                if isinstance(self.arguments, dict):
                    return tool(**self.arguments)
                return tool(self.arguments)
        raise KeyError(f"no Python function named {self.name!r} among the tools")


def as_tool(tool: Any) -> dict[str, Any]:
    """An OpenAI function tool {"type": "function", "function": {name, description,
    parameters}} from one, from its "function" part, or from a Python function."""
    if callable(tool) and not isinstance(tool, Mapping):
        return function_tool(tool)
    if not isinstance(tool, Mapping):
        raise TypeError(f"a tool is a Python function or a JSON-schema dict, got {tool!r}")
    function = tool.get("function", tool) if tool.get("type", "function") == "function" else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError(f"a tool dict needs a function name: {dict(tool)!r}")
    params = function.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, Mapping):
        raise ValueError(f"tool {function['name']!r}: parameters must be a JSON schema dict")
    out = {"name": function["name"], "parameters": dict(params)}
    if function.get("description"):
        out["description"] = str(function["description"])
    return {"type": "function", "function": out}


def function_tool(fn: Callable[..., Any]) -> dict[str, Any]:
    """The tool a Python function stands for (see the module's docstring). A parameter without
    a type hint takes its default's JSON type, or any JSON value."""
    name_of = getattr(fn, "__name__", None)
    if not isinstance(name_of, str) or not inspect.isroutine(fn):
        raise TypeError(f"a tool is a Python function (def or lambda with a name) or a tool "
                        f"dict, got {fn!r}: wrap it in a def")
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError) as exc:
        raise ValueError(f"tool {name_of}: its type hints cannot be read: {exc}") from None
    doc = inspect.getdoc(fn) or ""
    summary, arg_docs = _parse_docstring(doc)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ValueError(f"tool {name_of}: {param} cannot be passed by name: a tool's "
                             "arguments are a JSON object")
        if name in hints:
            schema = json_type(hints[name], f"{name_of}({name})")
        elif param.default is not param.empty and type(param.default) in _JSON_TYPES:
            schema = dict(_JSON_TYPES[type(param.default)])
        else:
            schema = {}  # any JSON value
        if name in arg_docs:
            schema = {**schema, "description": arg_docs[name]}
        properties[name] = schema
        if param.default is param.empty:
            required.append(name)
    parameters = {"type": "object", "properties": properties, "required": required}
    function: dict[str, Any] = {"name": name_of, "parameters": parameters}
    if summary:
        function["description"] = summary
    return {"type": "function", "function": function}


def json_type(hint: Any, where: str) -> dict[str, Any]:
    """The JSON schema of a type hint."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint in _JSON_TYPES:
        return dict(_JSON_TYPES[hint])
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, Sequence) and args:
        return {"type": "array", "items": json_type(args[0], where)}
    if origin in (dict, Mapping):
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return json_type(options[0], where)
        return {"anyOf": [json_type(a, where) for a in options]}
    if origin in _JSON_TYPES:
        return dict(_JSON_TYPES[origin])
    raise ValueError(f"{where}: type {hint!r} has no JSON schema here: use str, int, float, "
                     "bool, list[...], dict, Literal[...] or Optional[...]")


def tool_call_spec(tools: Sequence[Any], tool_choice: str = "required",
                   parallel: bool = True) -> tuple[list[dict[str, Any]], str]:
    """(the tools as OpenAI dicts, the runtime's tool_calls spec without a format: the server
    writes calls in its own). tool_choice: "required" (calls only), "auto" (text, or calls from
    the format's opener on), or one tool's name (calls of it only)."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence) or not tools:
        raise ValueError("tools must be a non-empty list of Python functions or tool dicts")
    described = [as_tool(t) for t in tools]
    names = [t["function"]["name"] for t in described]
    if len(set(names)) != len(names):
        raise ValueError(f"tools has duplicate names: {names}")
    if tool_choice in TOOL_CHOICES:
        chosen, mode = described, tool_choice
    elif tool_choice in names:
        chosen, mode = [t for t in described if t["function"]["name"] == tool_choice], "required"
    else:
        raise ValueError(f"tool_choice={tool_choice!r}: use 'required', 'auto' or one of the "
                         f"tools' names {names}")
    if not isinstance(parallel, bool):
        raise TypeError(f"parallel_tool_calls must be a bool, got {parallel!r}")
    spec = {"mode": mode, "parallel": parallel,
            "tools": [{"name": t["function"]["name"], "parameters": t["function"]["parameters"]}
                      for t in chosen]}
    return described, json.dumps(spec, sort_keys=True)


def tools_listing(tools: Sequence[Any]) -> str:
    """The tools as the tool prompt lists them: one JSON object per line."""
    return "\n".join(json.dumps(as_tool(t), ensure_ascii=False) for t in tools)


def parse_calls(calls: Sequence[tuple[str, str]]) -> list[ToolCall]:
    """The runtime's (name, arguments JSON) pairs as ToolCalls; ValueError for a call whose
    arguments were cut short (max_tokens ran out inside it)."""
    out = []
    for name, arguments in calls:
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError:
            raise ValueError(f"the call of {name!r} was cut short (its arguments so far: "
                             f"{arguments[:80]!r}): raise max_tokens") from None
        out.append(ToolCall(name, value))
    return out


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(the first paragraph, {parameter: description} from a Google-style Args: section)."""
    paragraphs = doc.split("\n\n")
    summary = paragraphs[0].strip() if paragraphs and not paragraphs[0].lstrip().startswith(
        "Args:") else ""
    args: dict[str, str] = {}
    match = re.search(r"^Args:\s*\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if match:
        current = None
        for line in match.group(1).splitlines():
            item = re.match(r"\s+(\w+)\s*(?:\([^)]*\))?:\s*(.*)", line)
            if item and (current is None or len(line) - len(line.lstrip()) <= 8):
                current = item.group(1)
                args[current] = item.group(2).strip()
            elif current is not None and line.strip():
                args[current] += " " + line.strip()
    return " ".join(summary.split()), args
