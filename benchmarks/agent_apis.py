"""Agent conversations over the APIs agent tools speak: Anthropic's Messages API and OpenAI's
Responses API, on radixrt and on llama.cpp's llama-server (which serves both), the same work.

Workload: --sessions agent sessions, --concurrency in flight, each three turns with the four
tools of tool_calls_workload.py (varied JSON schemas) and its system prompt:
  1. the user's request (tool_calls_workload.make_requests), the tool forced (Messages:
     tool_choice any with disable_parallel_tool_use; Responses: tool_choice required with
     parallel_tool_calls false): the call is checked against the tool's schema (jsonschema);
  2. the call's result sent back (tool_result / function_call_output; where the server made
     no call, the result as a user message, so every system runs the same three turns),
     tool_choice none: a text answer;
  3. "Thank you. Anything else I should know?": a text answer.
Greedy (temperature 0), max tokens 96 / 48 / 32. Each API has its own sessions (the two
Responses runs the same ones), and radixrt's cache is flushed before each API's run (its
stored responses' pins stay: the stateful run is last). The Messages API is stateless: every turn
sends the whole conversation. The Responses API runs twice on radixrt: stateless (store=false,
the whole conversation as input items, as on llama-server) and stateful (each turn sends only
its new input with previous_response_id; the stored conversation's KV stays pinned in the
radix tree). Each system takes one warm-up session first (grammars compiled, the tool prompt
cached).

Systems, one after another, each started cold and stopped after: radixrt (`radixrt serve`, its
defaults: the grammar enforces the calls) and llama.cpp (llama-server --jinja on the same GGUF
file with the Hermes ChatML template of tool_calls.py, a thread per core).

Measured per system and API: sessions/s and output tokens/s (wall; the outputs differ between
systems: a forced call is longer than the prose a model that makes no call writes), output
tokens per session, the p50 and p90 latency of a turn, valid calls
on turn 1 (of the sessions), errors (a turn the server refused), and the prompt tokens and the
cached prompt tokens of turns 2 and 3 (usage: Anthropic's input_tokens +
cache_read_input_tokens; OpenAI's input_tokens and cached_tokens). The table
gives radixrt / llama.cpp; results go to --json (benchmarks/results/agent_apis.json), the plot
to docs/plots/agent_apis.png.

    python benchmarks/agent_apis.py                       # 24 sessions, both APIs, both systems
    python benchmarks/agent_apis.py --quick --skip-llama  # 4 sessions, radixrt only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402
from serving_systems import LLAMA_CPP, System, http_json, running  # noqa: E402
from tool_calls import build_systems as tool_systems  # noqa: E402
from tool_calls_workload import SYSTEM_PROMPT, TOOLS, ToolRequest, call_problem, make_requests  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_JSON = os.path.join(HERE, "results", "agent_apis.json")
RADIXRT = "radixrt"
APIS = ("messages", "responses", "responses-stateful")  # the last: radixrt only
# Each API its own sessions (the same on every system; stateful and stateless Responses the
# same ones), so that no API's turns hit the cache another API's turns left behind.
SEED_OF = {"messages": 0, "responses": 1, "responses-stateful": 1}
MAX_TOKENS = (96, 48, 32)
FOLLOW_UP = "Thank you. Anything else I should know?"
NO_CALL_RESULT = "The tool returned: done."  # turn 2's input where turn 1 made no call
REQUEST_TIMEOUT_S = 300.0
MAX_TOTAL_TOKENS = 16384  # radixrt's KV pool (llama-server: 8 slots of 1024)


@dataclass
class Session:
    ok: bool = True
    error: str = ""
    valid_call: bool = False
    latencies: list[float] = field(default_factory=list)
    prompt_tokens: int = 0  # of turns 2 and 3
    cached_tokens: int = 0  # of turns 2 and 3
    output_tokens: int = 0  # of the three turns


def tool_result(name: str, arguments: Any) -> str:
    return json.dumps({"tool": name, "arguments": arguments, "result": "done"})


# --- the Messages API (stateless) ----------------------------------------------------------------
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


async def messages_session(client: Any, system: System, request: ToolRequest) -> Session:
    out = Session()
    conversation: list[dict[str, Any]] = [{"role": "user", "content": request.user}]
    choices = [{"type": "any", "disable_parallel_tool_use": True}, {"type": "none"},
               {"type": "none"}]
    for turn, (choice, max_tokens) in enumerate(zip(choices, MAX_TOKENS)):
        start = time.perf_counter()
        msg = await client.messages.create(
            model="default", system=SYSTEM_PROMPT, messages=conversation, tools=ANTHROPIC_TOOLS,
            tool_choice=choice, max_tokens=max_tokens,
            extra_body={"temperature": 0.0, **system.extra_body})
        out.latencies.append(time.perf_counter() - start)
        blocks = [b.model_dump() for b in msg.content]
        out.output_tokens += msg.usage.output_tokens
        if turn > 0:
            out.prompt_tokens += msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
            out.cached_tokens += msg.usage.cache_read_input_tokens or 0
        conversation.append({"role": "assistant", "content": blocks or [{"type": "text",
                                                                          "text": ""}]})
        if turn == 0:
            calls = [b for b in blocks if b["type"] == "tool_use"]
            if calls:
                out.valid_call = call_problem(calls[0]["name"], calls[0]["input"]) is None
                conversation.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": calls[0]["id"],
                     "content": tool_result(calls[0]["name"], calls[0]["input"])}]})
            else:  # no call: the session goes on with the result as text (counted invalid)
                conversation.append({"role": "user", "content": NO_CALL_RESULT})
        elif turn == 1:
            conversation.append({"role": "user", "content": FOLLOW_UP})
    return out


# --- the Responses API (stateless, or stateful with previous_response_id) -----------------------
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


async def responses_session(client: Any, system: System, request: ToolRequest,
                            stateful: bool) -> Session:
    out = Session()
    items: list[Any] = [{"role": "user", "content": request.user}]
    previous: str | None = None
    choices = ["required", "none", "none"]
    for turn, (choice, max_tokens) in enumerate(zip(choices, MAX_TOKENS)):
        start = time.perf_counter()
        resp = await client.responses.create(
            model="default", instructions=SYSTEM_PROMPT, input=items, tools=RESPONSES_TOOLS,
            tool_choice=choice, parallel_tool_calls=False, max_output_tokens=max_tokens,
            temperature=0.0, store=stateful, previous_response_id=previous,
            extra_body=system.extra_body)
        out.latencies.append(time.perf_counter() - start)
        usage = resp.usage
        out.output_tokens += usage.output_tokens
        if turn > 0:
            out.prompt_tokens += usage.input_tokens
            details = usage.input_tokens_details
            out.cached_tokens += (details.cached_tokens or 0) if details is not None else 0
        output = [item.model_dump(exclude_none=True) for item in resp.output]
        if stateful:
            items, previous = [], resp.id
        else:
            items += output
        if turn == 0:
            calls = [item for item in output if item["type"] == "function_call"]
            if calls:
                out.valid_call = call_problem(calls[0]["name"], calls[0]["arguments"]) is None
                items.append({"type": "function_call_output", "call_id": calls[0]["call_id"],
                              "output": tool_result(calls[0]["name"], calls[0]["arguments"])})
            else:  # no call: the session goes on with the result as text (counted invalid)
                items.append({"role": "user", "content": NO_CALL_RESULT})
        elif turn == 1:
            items.append({"role": "user", "content": FOLLOW_UP})
    return out


# --- running ------------------------------------------------------------------------------------
async def run_api(base: str, system: System, api: str, requests: list[ToolRequest],
                  concurrency: int) -> tuple[list[Session], float]:
    import anthropic
    import httpx
    from openai import AsyncOpenAI

    # a fresh connection per request, for every system alike (llama-server drops idle
    # keep-alive connections); the anthropic client is built on its own httpx (httpx2)
    if api == "messages":
        import httpx2

        http: Any = anthropic.DefaultAsyncHttpxClient(
            limits=httpx2.Limits(max_keepalive_connections=0), timeout=REQUEST_TIMEOUT_S)
        client: Any = anthropic.AsyncAnthropic(base_url=base, api_key="none", max_retries=0,
                                               timeout=REQUEST_TIMEOUT_S, http_client=http)
    else:
        http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0),
                                 timeout=REQUEST_TIMEOUT_S)
        client = AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                             timeout=REQUEST_TIMEOUT_S, http_client=http)
    gate = asyncio.Semaphore(concurrency)

    async def one(request: ToolRequest) -> Session:
        async with gate:
            try:
                if api == "messages":
                    return await messages_session(client, system, request)
                return await responses_session(client, system, request,
                                               stateful=api == "responses-stateful")
            except Exception as exc:  # the server refused a turn: counted, not fatal
                return Session(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])

    await one(requests[0])  # warm-up: grammars compiled, the tool prompt cached
    start = time.perf_counter()
    sessions = await asyncio.gather(*(one(r) for r in requests[1:]))
    elapsed = time.perf_counter() - start
    await http.aclose()
    return list(sessions), elapsed


def summarize(sessions: list[Session], elapsed: float) -> dict[str, Any]:
    latencies = sorted(t for s in sessions for t in s.latencies)
    done = [s for s in sessions if s.ok]
    prompt = sum(s.prompt_tokens for s in done)
    return {
        "sessions": len(sessions),
        "errors": len(sessions) - len(done),
        "first_error": next((s.error for s in sessions if not s.ok), ""),
        "sessions_per_s": len(done) / elapsed if elapsed > 0 else 0.0,
        "output_tokens_per_s": sum(s.output_tokens for s in done) / elapsed if elapsed else 0.0,
        "output_tokens_per_session": sum(s.output_tokens for s in done) / max(len(done), 1),
        "turn_p50_s": statistics.median(latencies) if latencies else 0.0,
        "turn_p90_s": latencies[int(0.9 * (len(latencies) - 1))] if latencies else 0.0,
        "valid_calls": sum(s.valid_call for s in done),
        "later_prompt_tokens": prompt,
        "later_cached_tokens": sum(s.cached_tokens for s in done),
        "later_cached_fraction": sum(s.cached_tokens for s in done) / prompt if prompt else 0.0,
        "elapsed_s": elapsed,
    }


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    rows = [f"{'system':10} {'api':19} {'sess/s':>7} {'out tok/s':>9} {'out/sess':>8} "
            f"{'p50 s':>6} {'p90 s':>6} {'valid':>6} {'errors':>6} {'cached':>7}"]
    for name, apis in results.items():
        for api, r in apis.items():
            answered = r["sessions"] - r["errors"]
            rows.append(f"{name:10} {api:19} {r['sessions_per_s']:7.2f} "
                        f"{r['output_tokens_per_s']:9.1f} {r['output_tokens_per_session']:8.1f} "
                        f"{r['turn_p50_s']:6.2f} "
                        f"{r['turn_p90_s']:6.2f} {r['valid_calls']:3d}/{answered:<2d} "
                        f"{r['errors']:6d} {r['later_cached_fraction']:7.0%}")
    peer = results.get(LLAMA_CPP, {})
    for api in ("messages", "responses"):
        if api in peer and api in results.get(RADIXRT, {}) and peer[api]["sessions_per_s"]:
            ours = results[RADIXRT][api]
            ratio = ours["sessions_per_s"] / peer[api]["sessions_per_s"]
            tokens = ours["output_tokens_per_s"] / max(peer[api]["output_tokens_per_s"], 1e-9)
            rows.append(f"radixrt / llama.cpp on {api}: sessions/s {ratio:.2f}x, output "
                        f"tokens/s {tokens:.2f}x")
    if "responses-stateful" in results.get(RADIXRT, {}) and peer.get("responses", {}).get(
            "sessions_per_s"):
        ratio = results[RADIXRT]["responses-stateful"]["sessions_per_s"] / \
            peer["responses"]["sessions_per_s"]
        rows.append(f"radixrt stateful / llama.cpp (stateless) sessions/s on responses: "
                    f"{ratio:.2f}x")
    return "\n".join(rows)


def plot(results: dict[str, dict[str, dict[str, Any]]], directory: str | None) -> str | None:
    groups = [api for api in APIS if any(api in apis for apis in results.values())]

    def series(key: str) -> dict[str, list[float]]:
        return {name: [apis.get(api, {}).get(key, 0.0) for api in groups]
                for name, apis in results.items()}

    return bar_panels(plot_path("agent_apis", directory),
                      "Three-turn tool-calling agent sessions, per API (SmolLM2-135M, CPU)",
                      groups, [("sessions / s", series("sessions_per_s")),
                               ("output tokens / s", series("output_tokens_per_s")),
                               ("p50 turn latency (s)", series("turn_p50_s")),
                               ("cached share of later prompts", series("later_cached_fraction"))])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--apis", nargs="+", choices=APIS, default=list(APIS))
    parser.add_argument("--systems", nargs="+", choices=(RADIXRT, LLAMA_CPP),
                        default=[RADIXRT, LLAMA_CPP])
    parser.add_argument("--quick", action="store_true", help="4 sessions, 2 at a time")
    parser.add_argument("--skip-llama", action="store_true")
    parser.add_argument("--llama-server", default=None, help="the llama-server binary")
    parser.add_argument("--llama-threads", type=int, default=None)
    parser.add_argument("--llama-template", choices=("hermes", "gguf"), default="hermes")
    parser.add_argument("--max-total-tokens", type=int, default=MAX_TOTAL_TOKENS)
    parser.add_argument("--json", default=DEFAULT_JSON)
    add_plot_dir(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.concurrency = 4, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems, notes = tool_systems(args)  # tool_calls.py's: radixrt, llama-server --jinja
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for system in systems:
        apis = [a for a in args.apis if system.name == RADIXRT or a != "responses-stateful"]
        with running(system) as base:
            for api in apis:
                if system.flushable:  # each API starts cold: no hits on another's sessions
                    http_json(base + "/flush_cache", method="POST")
                requests = make_requests(args.sessions + 1, args.seed + SEED_OF[api])
                sessions, elapsed = asyncio.run(run_api(base, system, api, requests,
                                                        args.concurrency))
                results.setdefault(system.name, {})[api] = summarize(sessions, elapsed)
                print(f"{system.name} {api}: {results[system.name][api]}", flush=True)
    print(table(results))
    for note in notes:
        print(note)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "results": results, "notes": notes}, f, indent=1,
                  default=str)
    path = plot(results, args.plot_dir)
    print(f"plot: {path}" if path else "plot skipped (no matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
