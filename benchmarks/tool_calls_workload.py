"""The tool-call benchmark's work (benchmarks/tool_calls.py): four tools with varied JSON
schemas, deterministic user requests dealt over them, the scoring of a response (a valid call of
the asked tool, a broken call, no call), and the ChatML template that gives llama-server a
Hermes tool format."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import jsonschema

CALL_OPENER = "<tool_call>"  # the Hermes format's (radixrt's built-in prompt, --llama-template)
SYSTEM_PROMPT = ("You are a helpful assistant. Answer the user's request by calling the one tool "
                 "that fits it, with arguments taken from the request.")


# --- tools and requests ------------------------------------------------------------------------
def tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}}


def string(max_length: int, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "maxLength": max_length, **extra}  # so every call ends in time


def bounded(kind: str, lo: int, hi: int) -> dict[str, Any]:
    return {"type": kind, "minimum": lo, "maximum": hi}


def obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


TOOLS: list[dict[str, Any]] = [
    tool("get_weather", "The current weather of a city.", obj(
        {"city": string(24), "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        ["city", "unit"])),
    tool("calculator", "One arithmetic operation on two numbers.", obj(
        {"operation": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]},
         "a": bounded("number", -1_000_000, 1_000_000),
         "b": bounded("number", -1_000_000, 1_000_000)},
        ["operation", "a", "b"])),
    tool("search_web", "Search the web; returns the top results.", obj(
        {"query": string(48),
         "keywords": {"type": "array", "items": string(20), "minItems": 1, "maxItems": 4},
         "max_results": bounded("integer", 1, 10)},
        ["query", "keywords"])),
    tool("book_hotel", "Book hotel rooms for a guest.", obj(
        {"guest": obj({"name": string(24), "email": string(32)}, ["name", "email"]),
         "stay": obj({"city": string(24),
                      "check_in": string(10, pattern="^[0-9]{4}-[0-9]{2}-[0-9]{2}$"),
                      "nights": bounded("integer", 1, 30)},
                     ["city", "check_in", "nights"]),
         "rooms": bounded("integer", 1, 5)},
        ["guest", "stay", "rooms"])),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Toronto", "Sydney", "Mumbai", "Berlin",
          "Nairobi", "Seoul", "Madrid")
TOPICS = ("electric cars", "the history of chess", "sourdough bread", "black holes",
          "remote work tips", "the Roman empire", "solar panels", "learning Spanish")
NAMES = ("Ada Lovelace", "Alan Turing", "Grace Hopper", "Linus Pauling", "Marie Curie",
         "Niels Bohr")
TEMPLATES: dict[str, tuple[str, ...]] = {
    "get_weather": ("What's the weather in {city}?",
                    "Is it cold in {city} right now? Give me the temperature in {unit}.",
                    "Tell me the weather in {city} in {unit}."),
    "calculator": ("Add {a} and {b}.", "What is {a} times {b}?", "Subtract {b} from {a}.",
                   "Divide {a} by {b}."),
    "search_web": ("Search the web for {topic}.", "Find me the top {n} articles about {topic}.",
                   "Look up {topic} online."),
    "book_hotel": ("Book a hotel in {city} for {name} ({email}) for {nights} nights from {date}.",
                   "Reserve {rooms} rooms in {city}, check-in {date}, {nights} nights, under the "
                   "name {name}, email {email}."),
}


@dataclass(frozen=True)
class ToolRequest:
    user: str
    tool: str  # the tool the request asks for
    seed: int


def make_requests(n: int, seed: int) -> list[ToolRequest]:
    """n requests, dealt round-robin over the tools, each from a random template and values."""
    rng = random.Random(seed)
    names = list(TEMPLATES)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        guest = rng.choice(NAMES)
        values = {"city": rng.choice(CITIES), "unit": rng.choice(["celsius", "fahrenheit"]),
                  "a": rng.randint(2, 999), "b": rng.randint(2, 999), "topic": rng.choice(TOPICS),
                  "n": rng.randint(3, 10), "name": guest, "nights": rng.randint(1, 14),
                  "email": guest.split()[0].lower() + "@example.com", "rooms": rng.randint(2, 4),
                  "date": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"}
        out.append(ToolRequest(rng.choice(TEMPLATES[name]).format(**values), name,
                               seed * 100_000 + i))
    return out


# --- checking the calls ------------------------------------------------------------------------
def call_problem(name: str | None, arguments: Any) -> str | None:
    """Why a call is not valid (None: it is): an unknown tool, arguments that do not parse as
    JSON (a string, as OpenAI sends them) or do not validate against the tool's schema."""
    if name not in SCHEMAS:
        return f"unknown tool {name!r}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return "arguments are not JSON"
    try:
        jsonschema.validate(arguments, SCHEMAS[name])
    except jsonschema.ValidationError as exc:
        return f"arguments do not match the schema: {exc.message}"
    return None


@dataclass
class Outcome:
    ok: bool = False  # the server answered
    error: str = ""
    calls: int = 0  # tool_calls in the response
    valid: bool = False  # calls > 0 and every call valid
    right_tool: bool = False
    broken: bool = False  # an opener in the content, or an invalid call
    problem: str = ""  # the first broken call's, or why a required response is not valid
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    finish_reason: str | None = None
    text: str = ""  # content and calls, for the examples printed


def judge(content: str | None, calls: list[tuple[str | None, Any]], expected: str) -> Outcome:
    """The outcome of one response: its content and its (name, arguments) calls."""
    problems = [p for p in (call_problem(name, args) for name, args in calls) if p is not None]
    opener = CALL_OPENER in (content or "")
    out = Outcome(ok=True, calls=len(calls), valid=bool(calls) and not problems)
    out.right_tool = out.valid and calls[0][0] == expected
    out.broken = opener or bool(problems)
    out.problem = (problems[0] if problems else "call opener in the content" if opener
                   else "" if calls else "no tool call")
    shown = [f"{name}({args if isinstance(args, str) else json.dumps(args)})"
             for name, args in calls]
    out.text = " ".join([*([repr(content)] if content else []), *shown])
    return out



# A ChatML template (SmolLM2's chat tokens) that renders tools and calls in the Hermes format,
# as Qwen 2.5's does: with it llama-server's --jinja tool support has a format to write calls in.
HERMES_CHATML_TEMPLATE = """\
{%- if tools %}{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are \
provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, \
"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or \
(message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}\
{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
