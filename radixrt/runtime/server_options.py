"""The options of `radixrt serve` beyond the engine's (EngineConfig): the address, keys, logging,
pins, tool calls and replicas, validated once. Their field metadata is also the command line's
flags (radixrt/config_flags.py)."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.config import PIN_LEASE_TTL_S, REASONING_FORMAT_NAMES

MAX_DP_SIZE = 64  # --dp-size
# one image's whole fetch (--media-fetch-timeout; tokenizer/media_fetch.py): lookups, connects,
# redirects
DEFAULT_MEDIA_FETCH_TIMEOUT_S = 10.0
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json")  # --tool-call-parser

LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_PIN_LEASE_TTL_S = 24 * 3600.0
MAX_MEDIA_FETCH_TIMEOUT_S = 600.0
MAX_MEDIA_DOMAINS = 256
HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})?")  # a DNS name (or an IPv4 literal)


@dataclass(frozen=True)
class ServerOptions:
    host: str = field(default="127.0.0.1", metadata={
        "help": "address to bind; 0.0.0.0 exposes the server"})
    port: int = field(default=30000, metadata={"help": "HTTP port"})
    api_key: str | None = field(default=None, metadata={
        "help": "require `Authorization: Bearer KEY` on every endpoint but /health"})
    api_key_file: str | None = field(default=None, metadata={
        "help": "named keys instead, one `name:key` per line: each key's name is the tenant of "
        "its requests (fair share, per-tenant caps, metrics)"})
    served_model_name: str | None = field(default=None, metadata={
        "help": "the name clients send as `model`; without it, the model's file or folder name"})
    log_level: str = field(default="info", metadata={
        "choices": LOG_LEVELS, "help": "of every process's log (loggers radixrt.serve, .http, "
        ".dsl, .pins, .scheduler, .worker); info shows a status line every 10 s"})
    dsl_port: int | None = field(default=None, metadata={
        "help": "also serve DSL clients (ZeroMQ) on tcp://HOST:PORT; they can always use the ipc "
        "endpoint the log names"})
    exit_with_parent: bool = field(default=False, metadata={
        "help": "stop when the process that started this server exits, however it exits "
        "(rx.Runtime() sets it, so a program's runtime never outlives the program)"})
    pin_lease_ttl_s: float = field(default=PIN_LEASE_TTL_S, metadata={
        "flag": "pin-lease-ttl", "help": "seconds a pinned prefix (a DSL fork's, an HTTP pin) "
        "outlives its client's last renewal; a client that dies loses its pins this long after"})
    tool_call_parser: str = field(default="auto", metadata={
        "choices": TOOL_CALL_PARSERS, "help": "the format tool calls are written in and parsed "
        "from: hermes (<tool_call> blocks; Qwen, Hermes, and the built-in tool prompt), "
        "llama3_json; auto picks from the chat template"})
    reasoning_parser: str | None = field(default=None, metadata={
        "choices": REASONING_FORMAT_NAMES, "help": "reasoning models: the <think> section goes "
        "to reasoning_content, the rest to content; constraints (tools, response_format) apply "
        "after the thinking"})
    tool_call_enforcement: bool = field(default=True, metadata={
        "help": "the grammar makes every tool call well-formed (tool_choice required / named: "
        "calls only; auto: from the call opener on); --no-tool-call-enforcement only parses"})
    disable_openapi: bool = field(default=False, metadata={
        "help": "do not serve the OpenAPI schema (GET /openapi.json) and its page (GET /docs); "
        "served, they need the API key like every route but /health"})
    disable_dashboard: bool = field(default=False, metadata={
        "help": "do not serve the live page GET /dashboard, its data GET /dashboard/stats and "
        "GET /debug/radix_tree (served, they need the API key like every route)"})
    dashboard_show_text: bool = field(default=False, metadata={
        "help": "show each radix tree node's first words on /dashboard and /debug/radix_tree "
        "(off: token counts only, since prompts may be private)"})
    otlp_traces_endpoint: str | None = field(default=None, metadata={
        "help": "send OpenTelemetry traces of every request (stages: queued, prefix matched, "
        "prefill chunks, decode, grammar compile, speculation) to this OTLP/HTTP collector, "
        "e.g. http://127.0.0.1:4318; a W3C traceparent header is honoured and answered; needs "
        "`pip install radixrt[otel]`"})
    dp_size: int = field(default=1, metadata={
        "help": "complete replicas (each its own processes and radix cache) behind the SGLang "
        "router on --port (needs `pip install radixrt[router]`)"})
    router_policy: str = field(default="cache_aware", metadata={
        "choices": ROUTER_POLICIES, "help": "how the router picks a replica: cache_aware keeps "
        "an approximate radix tree per replica and sends a request where its prefix is cached "
        "(load permitting)"})
    allowed_media_domains: tuple[str, ...] = field(default=(), metadata={
        "metavar": "HOST", "help": "hosts (names or IP literals; space- or comma-separated, or "
        "the flag repeated) whose loopback, private or link-local addresses image URLs may "
        "fetch; public hosts need no listing, and any other non-public address is refused"})
    allowed_local_media_path: str | None = field(default=None, metadata={
        "metavar": "DIR", "help": "image references may name local files (paths, file:// "
        "URLs) under this folder only (symlinks resolved); without it local files are refused"})
    media_fetch_timeout: float = field(default=DEFAULT_MEDIA_FETCH_TIMEOUT_S, metadata={
        "metavar": "SECONDS", "help": "the most one image URL's fetch may take (lookups, "
        "connects, redirects and body); one that takes longer is a 400"})
    replica_name: str | None = field(default=None, metadata={
        "expose": False, "help": "one of --dp-size's replicas: named in every response"})

    def __post_init__(self) -> None:
        def bad(name: str, value: Any, allowed: str) -> ValueError:
            return ValueError(f"ServerOptions.{name}={value!r} is invalid: {allowed}")

        for name in ("port", "dsl_port"):
            port = getattr(self, name)
            if port is not None and not 0 < port < 65536:
                raise bad(name, port, "use 1..65535")
        if self.api_key is not None and self.api_key_file is not None:
            raise bad("api_key_file", self.api_key_file,
                      "it names the keys, so give no single api_key with it (one or the other)")
        endpoint = self.otlp_traces_endpoint
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise bad("otlp_traces_endpoint", endpoint,
                      "give the collector's OTLP/HTTP URL, e.g. http://127.0.0.1:4318")
        if self.log_level not in LOG_LEVELS:
            raise bad("log_level", self.log_level, f"use one of {LOG_LEVELS}")
        if not 0 < self.pin_lease_ttl_s <= MAX_PIN_LEASE_TTL_S:
            raise bad("pin_lease_ttl_s", self.pin_lease_ttl_s,
                      f"use (0, {MAX_PIN_LEASE_TTL_S:.0f}] seconds")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise bad("tool_call_parser", self.tool_call_parser, f"use one of {TOOL_CALL_PARSERS}")
        if self.reasoning_parser not in (None, *REASONING_FORMAT_NAMES):
            raise bad("reasoning_parser", self.reasoning_parser,
                      f"use one of {REASONING_FORMAT_NAMES} (None: no reasoning section)")
        if not 1 <= self.dp_size <= MAX_DP_SIZE:
            raise bad("dp_size", self.dp_size, f"use 1..{MAX_DP_SIZE}")
        if self.router_policy not in ROUTER_POLICIES:
            raise bad("router_policy", self.router_policy, f"use one of {ROUTER_POLICIES}")
        self._check_media(bad)

    def _check_media(self, bad: Any) -> None:
        """The media flags: the domains as one tuple of hosts (commas split), the folder one
        that exists, the timeout a positive number of seconds."""
        given = self.allowed_media_domains
        entries = [given] if isinstance(given, str) else list(given)
        hosts = tuple(host.strip() for entry in entries for host in str(entry).split(",")
                      if host.strip())
        for host in hosts:
            if not _is_host(host):
                raise bad("allowed_media_domains", host, "give host names or IP literals "
                          "(example.com, 10.0.0.5, ::1), without a scheme, port or path")
        if len(hosts) > MAX_MEDIA_DOMAINS:
            raise bad("allowed_media_domains", len(hosts), f"at most {MAX_MEDIA_DOMAINS} hosts")
        object.__setattr__(self, "allowed_media_domains", hosts)
        path = self.allowed_local_media_path
        if path is not None and not os.path.isdir(path):
            raise bad("allowed_local_media_path", path, "name an existing folder")
        if not 0 < self.media_fetch_timeout <= MAX_MEDIA_FETCH_TIMEOUT_S:
            raise bad("media_fetch_timeout", self.media_fetch_timeout,
                      f"use (0, {MAX_MEDIA_FETCH_TIMEOUT_S:.0f}] seconds")


def _is_host(host: str) -> bool:
    """A DNS name or an IP literal (IPv6 with or without its brackets)."""
    try:
        ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
        return True
    except ValueError:
        return HOST_NAME.fullmatch(host) is not None
