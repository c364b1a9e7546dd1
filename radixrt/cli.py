"""The `radixrt` command line: `radixrt serve [options]` (also `python -m radixrt serve`)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import fields

from radixrt.plan_cli import add_plan_parser, run_plan
from radixrt.runtime.config import (
    ATTENTION_BACKENDS,
    DEFAULT_CUDA_GRAPH_MAX_BS,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_PINNED_FRACTION,
    DEFAULT_MODEL,
    DIST_BACKENDS,
    DTYPES,
    LOAD_FORMATS,
    PIN_LEASE_TTL_S,
    PREEMPTION_MODES,
    REASONING_FORMAT_NAMES,
    SCHEDULE_POLICIES,
    EngineConfig,
)

ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json")  # --tool-call-parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixrt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible server (tokenizer, scheduler and worker processes)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = serve.add_argument
    add("--model", default=DEFAULT_MODEL,
        help="'default' (SmolLM2-135M-Instruct, embedded), a .gguf file, or a checkpoint folder "
        "with config.json and safetensors")
    add("--served-model-name", default=None, help="the name clients send as `model`")
    add("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 exposes the server")
    add("--port", type=int, default=30000, help="HTTP port")
    add("--dsl-port", type=int, default=None,
        help="also serve DSL clients (ZeroMQ) on tcp://HOST:PORT; they can always use the ipc "
        "endpoint the log names")
    keys = serve.add_mutually_exclusive_group()
    keys.add_argument("--api-key", default=None,
                      help="require `Authorization: Bearer KEY` on every endpoint but /health")
    keys.add_argument("--api-key-file", default=None,
                      help="named keys instead, one `name:key` per line: each key's name is "
                      "the tenant of its requests (fair share, per-tenant caps, metrics)")
    add("--dtype", default="auto", choices=DTYPES,
        help="weights and KV dtype; auto = float32 on CPU, bfloat16 on CUDA")
    add("--device", default="auto", help="cpu, cuda, cuda:N; auto = cuda when available")
    add("--page-size", type=int, default=1,
        help="tokens per KV page: a power of two from 1 to 64 (1 or 16 are typical)")
    pool = serve.add_mutually_exclusive_group()
    pool.add_argument("--max-total-tokens", type=int, default=None,
                      help="KV pool size in tokens (default: from --mem-fraction)")
    pool.add_argument("--mem-fraction", type=float, default=0.5,
                      help="share of free device memory given to the KV pool")
    add("--context-length", type=int, default=None,
        help="longest prompt + output; default: the model's")
    add("--max-running-requests", type=int, default=256, help="requests decoding at once")
    add("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help="token budget of one forward pass (prefill is chunked to fit): larger favours a "
        "long prompt's time to first token, smaller the other requests' inter-token latency")
    add("--schedule-policy", default="lpm", choices=SCHEDULE_POLICIES,
        help="waiting-queue order: fcfs, longest cached prefix first, or radix-tree DFS")
    add("--preemption", default="recompute", choices=PREEMPTION_MODES,
        help="when KV runs out: recompute (cache hit on re-prefill) or swap to host memory")
    add("--disable-radix-cache", action="store_true", help="no prefix reuse (for comparison)")
    add("--disable-jump-forward", action="store_true",
        help="constrained decoding: sample grammar-forced tokens one step at a time")
    add("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
        help="auto = triton on CUDA, torch elsewhere")
    add("--cuda-graph-max-bs", type=int, default=DEFAULT_CUDA_GRAPH_MAX_BS,
        help="decode batches up to this size replay CUDA graphs (triton on CUDA); 0 disables")
    add("--load-format", default="auto", choices=LOAD_FORMATS,
        help="dummy = random weights from config.json (benchmarks of big shapes)")
    add("--seed", type=int, default=0, help="seed of unseeded sampling")
    add("--check-integrity", action="store_true",
        help="check the KV invariants after every step; a violation stops the server (debug)")
    add("--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="of every process's log (loggers radixrt.serve, .http, .dsl, .pins, .scheduler, "
        ".worker); info shows a status line every 10 s")
    add("--pin-lease-ttl", type=float, default=PIN_LEASE_TTL_S,
        help="seconds a pinned prefix (a DSL fork's, an HTTP pin) outlives its client's last "
        "renewal; a client that dies loses its pins this long after")
    add("--max-pinned-fraction", type=float, default=DEFAULT_MAX_PINNED_FRACTION,
        help="share of the KV pool that pinned prefixes (DSL forks, HTTP pin: true) may keep "
        "locked; a pin past it is refused with a message and the request runs unpinned")
    add("--priority-preemption", action=argparse.BooleanOptionalAction, default=True,
        help="a waiting request may preempt running requests of a less urgent (larger) "
        "priority; equal priorities never preempt each other")
    add("--fair-share", action=argparse.BooleanOptionalAction, default=True,
        help="within a priority, interleave tenants' admissions by the tokens each was served")
    add("--cascade-attention", action=argparse.BooleanOptionalAction, default=True,
        help="decode requests that share a cached prefix read it once per step, together "
        "(attention over the shared prefix and over each request's own tokens, merged)")
    add("--max-queued-requests", type=int, default=None,
        help="waiting requests past which a new one is refused with 429 and Retry-After")
    add("--max-queued-per-tenant", type=int, default=None,
        help="the same cap for each tenant's waiting requests")
    add("--tool-call-parser", default="auto", choices=TOOL_CALL_PARSERS,
        help="the format tool calls are written in and parsed from: hermes (<tool_call> "
        "blocks; Qwen, Hermes, and the built-in tool prompt), llama3_json; auto picks from "
        "the chat template")
    add("--reasoning-parser", default=None, choices=REASONING_FORMAT_NAMES,
        help="reasoning models: the <think> section goes to reasoning_content, the rest to "
        "content; constraints (tools, response_format) apply after the thinking")
    add("--tool-call-enforcement", action=argparse.BooleanOptionalAction, default=True,
        help="the grammar makes every tool call well-formed (tool_choice required / named: "
        "calls only; auto: from the call opener on); --no-tool-call-enforcement only parses")
    _add_scale_out_flags(serve)
    add_plan_parser(sub)
    add = serve.add_argument
    add("--exit-with-parent", action="store_true",
        help="stop when the process that started this server exits, however it exits "
        "(rx.Runtime() sets it, so a program's runtime never outlives the program)")
    return parser


def _add_scale_out_flags(serve: argparse.ArgumentParser) -> None:
    """Tensor parallelism (SGLang's flag names) and data-parallel replicas."""
    add = serve.add_argument
    add("--tp-size", type=int, default=1,
        help="tensor-parallel worker ranks (torch.distributed: nccl on CUDA, gloo on the CPU)")
    add("--nnodes", type=int, default=1, help="machines the tensor-parallel ranks span")
    add("--node-rank", type=int, default=0,
        help="this machine's index among --nnodes; node 0 serves, the others run ranks only")
    add("--dist-init-addr", default=None,
        help="HOST:PORT where the ranks meet (node 0's address, the same on every node); "
        "default: a free loopback port")
    add("--dist-backend", default="auto", choices=DIST_BACKENDS,
        help="auto = nccl on CUDA, gloo on the CPU")
    add("--base-gpu-id", type=int, default=0, help="on CUDA, local rank i uses cuda:(N + i)")
    add("--dp-size", type=int, default=1,
        help="complete replicas (each its own processes and radix cache) behind the SGLang "
        "router on --port (needs `pip install radixrt[router]`)")
    add("--router-policy", default="cache_aware", choices=ROUTER_POLICIES,
        help="how the router picks a replica: cache_aware keeps an approximate radix tree per "
        "replica and sends a request where its prefix is cached (load permitting)")


def as_flags(message: str, names: Sequence[str]) -> str:
    """A config error in the words of the command line: `EngineConfig.page_size=3` and
    `page_size=3` become `--page-size=3`."""
    for name in sorted(names, key=len, reverse=True):
        flag = "--" + name.replace("_", "-")
        message = re.sub(rf"(EngineConfig\.)?\b{name}=", f"{flag}=", message)
    return message


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "plan":
        return run_plan(args)
    if args.command == "serve":
        from radixrt.runtime.launcher import ServerOptions, serve
        from radixrt.runtime.worker.setup import check_config

        try:
            # every EngineConfig field with a flag of the same name (swap space has none)
            names = [f.name for f in fields(EngineConfig) if hasattr(args, f.name)]
            config = EngineConfig(**{name: getattr(args, name) for name in names})
            check_config(config)  # the model, the device, the context length: before any process
        except (ValueError, OSError) as exc:
            print(f"radixrt serve: {as_flags(str(exc), names)}", file=sys.stderr)
            return 2
        if args.api_key_file is not None:
            from radixrt.runtime.server.tenants import ApiKeys

            try:
                ApiKeys.from_file(args.api_key_file)
            except (ValueError, OSError) as exc:
                print(f"radixrt serve: --api-key-file: {exc}", file=sys.stderr)
                return 2
        if not 0 < args.pin_lease_ttl <= 86400:
            print(f"radixrt serve: --pin-lease-ttl={args.pin_lease_ttl} is invalid: use "
                  "(0, 86400] seconds", file=sys.stderr)
            return 2
        for flag, port in (("--port", args.port), ("--dsl-port", args.dsl_port)):
            if port is not None and not 0 < port < 65536:
                print(f"radixrt serve: {flag}={port} is invalid: use 1..65535", file=sys.stderr)
                return 2
        options = ServerOptions(
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            api_key_file=args.api_key_file,
            served_model_name=args.served_model_name,
            log_level=args.log_level,
            dsl_port=args.dsl_port,
            exit_with_parent=args.exit_with_parent,
            pin_lease_ttl_s=args.pin_lease_ttl,
            tool_call_parser=args.tool_call_parser,
            reasoning_parser=args.reasoning_parser,
            tool_call_enforcement=args.tool_call_enforcement,
            dp_size=args.dp_size,
            router_policy=args.router_policy,
        )
        if options.dp_size != 1:  # replicas behind the router (dp_size < 1: refused there)
            from radixrt.runtime.replicas import serve_replicas

            return serve_replicas(config, options)
        return serve(config, options)
    return 2
