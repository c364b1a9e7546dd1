"""Who a request is from, and how the scheduler should treat it.

A tenant is the name of the API key a request carried when the keys come from `--api-key-file`
(one `name:key` per line, optionally followed by the tenant's fair-share weight:
`name:key weight=2`); else the OpenAI `user` field; else "" (one tenant shared by everyone).
Keys are compared in constant time, and against every key, so neither the timing of a match nor
its position in the file tells anything about the keys.

`scheduling_for` turns a request's priority, cache_salt, timeout and tenant into the one
Scheduling message the runtime takes (bounded there; a bad value is a 400 naming the field).
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from starlette.requests import Request

from radixrt.runtime.config import (
    MAX_NAME_CHARS,
    EngineConfig,
    check_tenant_name,
    check_tenant_weight,
    parse_tenant_weights,
)
from radixrt.runtime.messages import Scheduling
from radixrt.runtime.server.core.error_shapes import APIError, param_of

TENANT_STATE = "tenant"  # where BearerAuth leaves the key's name in the ASGI scope's state
# `name:key weight=W`: the optional weight column of a key file (a key may hold spaces and
# colons; it ends where " weight=" starts the last field)
WEIGHT_COLUMN = re.compile(r"(.*?)\s+weight=(\S*)")


@dataclass(frozen=True)
class ApiKeys:
    """The keys the server accepts: (tenant name or None, key). One --api-key has no name (its
    requests' tenant comes from `user`); keys from a file are named."""

    entries: tuple[tuple[str | None, bytes], ...]
    weights: tuple[tuple[str, float], ...] = ()  # (name, fair-share weight) given in the file

    @classmethod
    def single(cls, key: str) -> ApiKeys:
        return cls(((None, key.encode()),))

    @classmethod
    def from_file(cls, path: str | Path) -> ApiKeys:
        """Parse `name:key` lines, each optionally followed by whitespace and `weight=W`, the
        tenant's weight (blank lines and lines starting with # are skipped). Raises ValueError
        naming the line that is wrong."""
        entries: list[tuple[str | None, bytes]] = []
        weights: list[tuple[str, float]] = []
        names: set[str] = set()
        keys: set[str] = set()
        text = Path(path).read_text(encoding="utf-8")
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, rest = (part.strip() for part in line.partition(":"))
            where = f"{path}, line {number}"
            weighted = WEIGHT_COLUMN.fullmatch(rest)
            key = weighted.group(1) if weighted else rest
            if not sep or not name or not key:
                raise ValueError(f"{where}: expected 'name:key' or 'name:key weight=W'")
            if weighted:
                try:
                    weights.append((check_tenant_name(name),
                                    check_tenant_weight(name, weighted.group(2))))
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
            if len(name) > MAX_NAME_CHARS:
                raise ValueError(f"{where}: the name is longer than {MAX_NAME_CHARS} characters")
            if name in names or key in keys:
                raise ValueError(f"{where}: the name or the key appears twice")
            names.add(name)
            keys.add(key)
            entries.append((name, key.encode()))
        if not entries:
            raise ValueError(f"{path}: no 'name:key' lines")
        return cls(tuple(entries), tuple(weights))

    def match(self, given: bytes) -> tuple[bool, str | None]:
        """(whether `given` is one of the keys, the name of that key)."""
        found, name = False, None
        for entry_name, key in self.entries:  # every key, every time: constant time
            if hmac.compare_digest(given, key):
                found, name = True, entry_name
        return found, name


def api_keys(api_key: str | None, api_key_file: str | None) -> ApiKeys | None:
    """The keys of --api-key or --api-key-file (None: no key needed)."""
    if api_key_file:
        return ApiKeys.from_file(api_key_file)
    return ApiKeys.single(api_key) if api_key else None


def with_key_weights(config: EngineConfig, keys: ApiKeys | None) -> EngineConfig:
    """`config` with the key file's weights added to its tenant_weights; ValueError when both
    weigh the same tenant."""
    if keys is None or not keys.weights:
        return config
    given = parse_tenant_weights(config.tenant_weights)
    both = sorted(name for name, _ in keys.weights if name in given)
    if both:
        raise ValueError(f"tenant(s) {both} weighed by both --tenant-weights and "
                         "--api-key-file: give each weight once")
    merged = [*given.items(), *keys.weights]
    text = ",".join(f"{name}:{weight!r}" for name, weight in merged)
    return replace(config, tenant_weights=text)


def tenant_of(request: Request, user: str | None) -> str:
    """The API key's name, else the OpenAI `user`, else the shared tenant ""."""
    named = request.scope.get("state", {}).get(TENANT_STATE)
    if named is not None:
        return named
    return user or ""


def scheduling_for(request: Request, body: Any, lora: str | None = None) -> Scheduling:
    """The Scheduling of a request body with optional priority / cache_salt / timeout / user
    fields (the OpenAI bodies' extras and /generate's), under LoRA adapter `lora` (None: the
    base model)."""
    try:
        return Scheduling(
            priority=body.priority if body.priority is not None else 0,
            tenant=tenant_of(request, body.user),
            extra_key=body.cache_salt or None,
            timeout_s=body.timeout,
            lora=lora,
        )
    except ValueError as exc:
        message = str(exc)
        raise APIError(message, param=param_of(message) or message.split(" ", 1)[0]) from None
