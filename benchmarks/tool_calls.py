"""Tool calls over /v1/chat/completions: how many responses are valid calls, and how fast, with
radixrt's grammar enforcing the calls, with it off, and with llama.cpp's own tool support.

Workload: four tools with varied JSON schemas (get_weather: a string and an enum; calculator: an
enum and bounded numbers; search_web: an array of strings and a bounded integer; book_hotel:
nested objects, a date pattern, bounded integers) and --num-requests user requests made
deterministically from templates ("What's the weather in {city}?", "Add {a} and {b}.", ...),
dealt round-robin over the tools. Every request has the same system prompt and the same tools,
so the prompt up to the user turn is shared (the radix cache hits the tool prompt). Sampled:
temperature 0.7, top_p 1, a seed per request (the same seeds on every system), max_tokens 96,
parallel_tool_calls false, non-streaming, --concurrency requests in flight through
`openai.AsyncOpenAI`; each system takes one warm-up request per tool_choice first (so the tool
grammar is compiled and the tool prompt cached before the clock starts).

Systems, one after another, each started cold and stopped after:
  radixrt            `radixrt serve` with its defaults: the grammar enforces the calls
                     (required: only well-formed calls whose arguments match the tool's schema;
                     auto: free text until the model writes <tool_call>, then a well-formed call)
  radixrt-unenforced `radixrt serve --no-tool-call-enforcement`: the same prompt (the built-in
                     Hermes tool prompt), the output only parsed for <tool_call>{json}</tool_call>
  llama.cpp          its C++ llama-server (../shared/llama-server, or --llama-server) with --jinja
                     on the same GGUF file, its own tool-call support through the OpenAI tools API;
                     --llama-template hermes (the default) gives it a ChatML template that renders
                     tools in the Hermes format (SmolLM2's own template has no tools, and with it
                     llama-server leaves the tools out of the prompt); `model` keeps the GGUF's

Measured per system and tool_choice:
  valid       responses whose tool_calls is non-empty and every call names one of the tools, its
              arguments parse as JSON and validate against that tool's schema (jsonschema)
  right tool  valid responses whose (first) call is the tool the request asks for
  broken      responses with a broken call: the call opener left in the content, or a call that
              names no tool, or whose arguments do not parse or do not validate
  calls/s     calls of the valid responses per wall second; req/s; mean completion, prompt and
              cached prompt tokens (usage); for radixrt, model steps per request (GET /server_info
              "steps" after minus before, over the requests: forward passes, each serving the
              whole running batch; jump-forward appends the fixed JSON text without steps) and
              completion tokens per step
The table gives the ratios radixrt / radixrt-unenforced and radixrt / llama.cpp; the results go
to --json (benchmarks/results/tool_calls.json) and the plot to docs/plots/tool_calls.png.

    python benchmarks/tool_calls.py                          # 48 requests, required, 3 systems
    python benchmarks/tool_calls.py --modes required auto    # also tool_choice="auto"
    python benchmarks/tool_calls.py --quick --skip-llama     # 8 requests, radixrt only
    python benchmarks/tool_calls.py --llama-threads 1        # llama-server on a busy machine
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import dataclasses
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from plots import add_plot_dir, bar_panels, plot_path  # noqa: E402
from serving_requests import openai_client  # noqa: E402
from serving_systems import (  # noqa: E402
    LLAMA_CPP,
    LLAMA_SERVER,
    System,
    gguf_path,
    http_json,
    llama_server_system,
    radixrt_system,
    running,
)
from tool_calls_workload import (  # noqa: E402
    HERMES_CHATML_TEMPLATE,
    SYSTEM_PROMPT,
    TOOLS,
    Outcome,
    ToolRequest,
    judge,
    make_requests,
)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_JSON = os.path.join(HERE, "results", "tool_calls.json")
RADIXRT, UNENFORCED = "radixrt", "radixrt-unenforced"
SYSTEMS = (RADIXRT, UNENFORCED, LLAMA_CPP)
MODES = ("required", "auto")


# --- systems -----------------------------------------------------------------------------------
def radixrt_tool_system(name: str, args: argparse.Namespace) -> System:
    base = radixrt_system("radixrt-lpm", args)
    extra = ["--exit-with-parent", *(["--no-tool-call-enforcement"] if name == UNENFORCED
                                     else [])]
    return dataclasses.replace(base, name=name, command=[*base.command, *extra], extra_body={})


def llama_tool_system(binary: str, args: argparse.Namespace) -> System:
    """llama-server --jinja, a thread per core unless --llama-threads; sampling as radixrt's
    (its defaults add top_k 40 and min_p 0.05)."""
    base = llama_server_system(binary)
    command = list(base.command)
    command[command.index("-t") + 1] = str(args.llama_threads or os.cpu_count() or 1)
    command.append("--jinja")
    if args.llama_template == "hermes":
        fd, path = tempfile.mkstemp(prefix="tool_calls-hermes-", suffix=".jinja")
        with os.fdopen(fd, "w") as f:  # a private file of this run, removed at exit
            f.write(HERMES_CHATML_TEMPLATE)
        atexit.register(os.unlink, path)
        command += ["--chat-template-file", path]
    return dataclasses.replace(base, command=command, extra_body={"top_k": 0, "min_p": 0.0})


def build_systems(args: argparse.Namespace) -> tuple[list[System], list[str]]:
    systems = [radixrt_tool_system(name, args) for name in (RADIXRT, UNENFORCED)
               if name in args.systems]
    if LLAMA_CPP not in args.systems:
        return systems, []
    if args.skip_llama:
        return systems, ["llama.cpp: skipped (--skip-llama)"]
    binary = args.llama_server or (LLAMA_SERVER if os.access(LLAMA_SERVER, os.X_OK) else None)
    if binary is None:
        note = (f"llama.cpp: skipped (no llama-server at {LLAMA_SERVER}; see "
                "../shared/llama-server/BUILD.md, or give --llama-server BINARY)")
        print(note)
        return systems, [note]
    return [*systems, llama_tool_system(binary, args)], []


# --- load --------------------------------------------------------------------------------------
@dataclass
class Run:
    system: str
    mode: str
    seconds: float
    warmup_seconds: float
    outcomes: list[Outcome]
    steps: int | None = None  # radixrt's forward passes during the run
    notes: list[str] = field(default_factory=list)


async def one_call(client: Any, system: System, request: ToolRequest, mode: str,
                   args: argparse.Namespace) -> Outcome:
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": request.user}]
    try:
        resp = await client.chat.completions.create(
            model="default", messages=messages, tools=TOOLS, tool_choice=mode,
            parallel_tool_calls=False, temperature=args.temperature, top_p=1.0,
            max_tokens=args.max_tokens, seed=request.seed, extra_body=system.extra_body)
    except Exception as exc:  # a failed request is reported, not fatal
        return Outcome(error=f"{type(exc).__name__}: {exc}", problem="request failed")
    choice = resp.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    out = judge(choice.message.content, calls, request.tool)
    out.finish_reason = choice.finish_reason
    if resp.usage is not None:
        out.completion_tokens = resp.usage.completion_tokens
        out.prompt_tokens = resp.usage.prompt_tokens
        details = resp.usage.prompt_tokens_details
        out.cached_tokens = details.cached_tokens if details is not None else None
    return out


async def run_mode(base: str, system: System, requests: list[ToolRequest], mode: str,
                   args: argparse.Namespace) -> Run:
    client = openai_client(base)
    limit = asyncio.Semaphore(args.concurrency)

    async def limited(request: ToolRequest) -> Outcome:
        async with limit:
            return await one_call(client, system, request, mode, args)

    async with client:
        start = time.perf_counter()
        warm = await one_call(client, system, ToolRequest("Hello!", "", 1), mode, args)
        warmup = time.perf_counter() - start
        before = steps_of(base, system)
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(limited(r) for r in requests))
        seconds = time.perf_counter() - start
        after = steps_of(base, system)
    steps = after - before if before is not None and after is not None else None
    notes = [f"warm-up failed: {warm.error}"] if not warm.ok else []
    return Run(system.name, mode, seconds, warmup, list(outcomes), steps, notes)


def steps_of(base: str, system: System) -> int | None:
    return int(http_json(base + "/server_info")["steps"]) if system.flushable else None


# --- results -----------------------------------------------------------------------------------
def summarize(run: Run) -> dict[str, Any]:
    n = max(len(run.outcomes), 1)
    ok = [o for o in run.outcomes if o.ok]
    valid = [o for o in ok if o.valid]
    completion = sum(o.completion_tokens for o in ok)
    cached = [o.cached_tokens for o in ok if o.cached_tokens is not None]
    seconds = max(run.seconds, 1e-9)
    finish: dict[str, int] = {}
    for o in ok:
        finish[str(o.finish_reason)] = finish.get(str(o.finish_reason), 0) + 1
    return {
        "system": run.system, "tool_choice": run.mode, "requests": len(run.outcomes),
        "failed": len(run.outcomes) - len(ok), "seconds": run.seconds,
        "warmup_seconds": run.warmup_seconds,
        "valid": len(valid), "valid_rate": len(valid) / n,
        "right_tool": sum(o.right_tool for o in valid), "broken": sum(o.broken for o in ok),
        "broken_rate": sum(o.broken for o in ok) / n,
        "with_calls": sum(o.calls > 0 for o in ok),
        "calls_per_s": sum(o.calls for o in valid) / seconds,
        "requests_per_s": len(ok) / seconds,
        "mean_completion_tokens": completion / max(len(ok), 1),
        "mean_prompt_tokens": sum(o.prompt_tokens for o in ok) / max(len(ok), 1),
        "mean_cached_tokens": sum(cached) / len(cached) if cached else None,
        "steps": run.steps,
        "steps_per_request": run.steps / n if run.steps is not None else None,
        "tokens_per_step": completion / run.steps if run.steps else None,
        "finish_reasons": finish,
        "problems": problem_counts(run.outcomes),
        "examples": [o.text or o.error for o in run.outcomes[:3]],
        "valid_example": next((o.text for o in valid), None),
        "notes": run.notes,
    }


def problem_counts(outcomes: list[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.problem:
            key = o.problem.split(":")[0]
            counts[key] = counts.get(key, 0) + 1
    return counts


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "n/a" if value is None else format(value, spec)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else ("n/a (both 0)" if not a else "inf (the other is 0)")


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace, notes: list[str]) -> None:
    print("\n| system | tool_choice | valid | right tool | broken | valid calls/s | req/s "
          "| completion tok | prompt tok | cached tok | steps/request | tok/step | failed |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        n = r["requests"]
        print(f"| {r['system']} | {r['tool_choice']} | {r['valid']}/{n} ({r['valid_rate']:.0%}) "
              f"| {r['right_tool']}/{n} | {r['broken']}/{n} | {r['calls_per_s']:.2f} "
              f"| {r['requests_per_s']:.2f} | {r['mean_completion_tokens']:.1f} "
              f"| {r['mean_prompt_tokens']:.0f} | {fmt(r['mean_cached_tokens'], '.0f')} "
              f"| {fmt(r['steps_per_request'])} | {fmt(r['tokens_per_step'], '.2f')} "
              f"| {r['failed']} |")
    by = {(r["system"], r["tool_choice"]): r for r in rows}
    print()
    for mode in args.modes:
        ours = by.get((RADIXRT, mode))
        for other in (UNENFORCED, LLAMA_CPP):
            theirs = by.get((other, mode))
            if ours is None or theirs is None:
                continue
            print(f"{RADIXRT} / {other} ({mode}): valid-call rate "
                  f"{ratio(ours['valid_rate'], theirs['valid_rate'])}, valid calls/s "
                  f"{ratio(ours['calls_per_s'], theirs['calls_per_s'])}, req/s "
                  f"{ratio(ours['requests_per_s'], theirs['requests_per_s'])}")
    print(f"\n{args.num_requests} requests per tool_choice over {len(TOOLS)} tools, concurrency "
          f"{args.concurrency}, temperature {args.temperature}, max_tokens {args.max_tokens}, "
          f"parallel_tool_calls false; CPU count {os.cpu_count()}")
    for r in rows:
        if r["problems"]:
            print(f"{r['system']} ({r['tool_choice']}) problems: {r['problems']}; finish "
                  f"reasons: {r['finish_reasons']}")
    print(f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}")
    for note in notes:
        print(note)


def print_examples(rows: list[dict[str, Any]]) -> None:
    print("\nfirst responses:")
    for r in rows:
        for text in r["examples"]:
            print(f"  {r['system']} ({r['tool_choice']}): {text[:200]}")


def plot(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    systems = list(dict.fromkeys(r["system"] for r in rows))
    modes = [m for m in args.modes if any(r["tool_choice"] == m for r in rows)]
    by = {(r["system"], r["tool_choice"]): r for r in rows}

    def series(key: str, scale: float = 1.0, only: tuple[str, ...] | None = None
               ) -> dict[str, list[float]]:
        return {s: [(by[s, m][key] or 0.0) * scale if (s, m) in by else 0.0 for m in modes]
                for s in systems if only is None or s in only}

    panels = [("valid calls, % of requests (higher is better)", series("valid_rate", 100.0)),
              ("valid calls/s (higher is better)", series("calls_per_s")),
              ("model steps per request (lower is better)",
               series("steps_per_request", only=(RADIXRT, UNENFORCED)))]
    parts = []
    for mode in modes:
        ours, theirs = by.get((RADIXRT, mode)), by.get((UNENFORCED, mode))
        if ours and theirs:
            parts.append(f"{mode}: enforced/unenforced valid rate "
                         f"{ratio(ours['valid_rate'], theirs['valid_rate'])}, calls/s "
                         f"{ratio(ours['calls_per_s'], theirs['calls_per_s'])}")
    caption = (f"{args.num_requests} requests over {len(TOOLS)} tools (string+enum, bounded "
               f"numbers, string array, nested objects), concurrency {args.concurrency}, "
               f"temperature {args.temperature}, {model_name()} on {os.cpu_count()} CPUs. "
               + "; ".join(parts))
    bar_panels(plot_path("tool_calls", args.plot_dir),
               "Tool calls: radixrt's grammar-enforced calls vs unenforced vs llama.cpp",
               [f"tool_choice={m}" for m in modes], panels, caption)


def model_name() -> str:
    return os.path.splitext(os.path.basename(gguf_path()))[0]


def write_json(rows: list[dict[str, Any]], args: argparse.Namespace, notes: list[str]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
                   "settings": {k: v for k, v in vars(args).items() if k != "json"},
                   "cpu_count": os.cpu_count(), "model": model_name(), "tools": TOOLS,
                   "notes": notes, "results": rows}, f, indent=1)
    print(f"results: {args.json}")


# --- main --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument("--num-requests", type=int, default=48, help="requests per tool_choice")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    p.add_argument("--modes", nargs="+", choices=MODES, default=["required"],
                   help="the tool_choice values to run, one after another on each server")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0, help="of the requests and their seeds")
    p.add_argument("--max-total-tokens", type=int, default=8192, help="radixrt KV pool")
    p.add_argument("--skip-llama", action="store_true", help="leave llama.cpp out")
    p.add_argument("--llama-server", default=None,
                   help="llama.cpp's llama-server binary (default: ../shared/llama-server/)")
    p.add_argument("--llama-template", choices=["hermes", "model"], default="hermes",
                   help="hermes: a ChatML template that renders tools in the Hermes format; "
                   "model: the GGUF's own (SmolLM2's has no tools)")
    p.add_argument("--llama-threads", type=int, default=None,
                   help="llama-server -t (default: a thread per core; on a machine that is busy "
                   "with other work, 1 avoids its spinning threads waiting on each other)")
    p.add_argument("--json", default=DEFAULT_JSON, help="where the results go")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: 8 requests, concurrency 4")
    add_plot_dir(p)
    args = p.parse_args(argv)
    if args.quick:
        args.num_requests, args.concurrency = 8, 4
    return args


def exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through `running`, which stops the server


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    requests = make_requests(args.num_requests, args.seed)
    systems, notes = build_systems(args)
    rows: list[dict[str, Any]] = []
    for system in systems:
        try:
            with running(system) as base:
                for mode in args.modes:
                    rows.append(summarize(asyncio.run(run_mode(base, system, requests, mode,
                                                               args))))
                    r = rows[-1]
                    print(f"{system.name} ({mode}): {r['valid']}/{r['requests']} valid, "
                          f"{r['calls_per_s']:.2f} valid calls/s, {r['seconds']:.1f} s",
                          flush=True)
        except (RuntimeError, TimeoutError) as exc:
            print(f"{system.name}: {exc}", file=sys.stderr)
            notes.append(f"{system.name}: failed ({str(exc).splitlines()[0]})")
    print_examples(rows)
    print_table(rows, args, notes)
    write_json(rows, args, notes)
    plot(rows, args)
    return 0 if rows and all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
