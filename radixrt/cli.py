"""The `radixrt` command line: `radixrt serve [options]` (also `python -m radixrt serve`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from radixrt.config_flags import add_flags, as_flags, from_flags
from radixrt.plan_cli import add_plan_parser, run_plan
from radixrt.runtime.config import EngineConfig
from radixrt.runtime.server_options import ServerOptions

SERVE_OPTIONS = (EngineConfig, ServerOptions)  # every serve flag is a field of one of these


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixrt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible server (tokenizer, scheduler and worker processes)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_flags(serve, EngineConfig, "engine (the model, the KV pool, scheduling, parallelism)")
    add_flags(serve, ServerOptions, "server (HTTP and DSL endpoints, keys, logs, replicas)")
    add_plan_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "plan":
        return run_plan(args)
    if args.command == "serve":
        from radixrt.runtime.launcher import serve
        from radixrt.runtime.worker.setup import check_config

        try:
            config = from_flags(EngineConfig, args)
            options = from_flags(ServerOptions, args)
            check_config(config)  # the model, the device, the context length: before any process
        except (ValueError, OSError) as exc:
            print(f"radixrt serve: {as_flags(str(exc), SERVE_OPTIONS)}", file=sys.stderr)
            return 2
        if options.api_key_file is not None:
            from radixrt.runtime.server.core.tenants import ApiKeys, with_key_weights

            try:
                with_key_weights(config, ApiKeys.from_file(options.api_key_file))
            except (ValueError, OSError) as exc:
                print(f"radixrt serve: --api-key-file: {exc}", file=sys.stderr)
                return 2
        if options.dp_size != 1:  # replicas behind the router
            from radixrt.runtime.replicas import serve_replicas

            return serve_replicas(config, options)
        return serve(config, options)
    return 2
