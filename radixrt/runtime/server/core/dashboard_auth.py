"""How a browser shows the API key to the dashboard's routes: a browser cannot add an
`Authorization` header when it opens a page, so GET requests to the dashboard's paths (and only
those, and only reading) may carry the key as the `api_key` query parameter (opening
`/dashboard?api_key=KEY` once), or the token that answer sets as a cookie (HttpOnly,
SameSite=Strict: never sent by another site's page, never readable by a script; Secure over
https). The token is an HMAC of the key under a secret of this process, never the key itself,
and it is void when the server restarts. The access log never shows a query's key (RedactKeys).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs, unquote_plus

from starlette.types import Scope

from radixrt.runtime.server.core.tenants import ApiKeys

DASHBOARD_PATH = "/dashboard"
DASHBOARD_PATHS = (DASHBOARD_PATH, "/debug/radix_tree")  # and what is below them
DASHBOARD_COOKIE = "radixrt_dashboard"  # + "_<port>": a host's servers keep their own
KEY_QUERY = "api_key"
SECRET_BYTES = 32
QUERY_PAIR = re.compile(r"([?&;])([^=&;\s\"]*)=([^&;\s\"]*)")


def is_dashboard_read(scope: Scope) -> bool:
    path = scope["path"]
    return scope.get("method") in ("GET", "HEAD") and any(
        path == p or path.startswith(p + "/") for p in DASHBOARD_PATHS)


class BrowserKeys:
    """The keys a dashboard read may bring without a header, and the cookie token of each."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys
        self._secret = os.urandom(SECRET_BYTES)
        self._names = {self._token(key): name for name, key in keys.entries}

    def _token(self, key: bytes) -> str:
        return hmac.new(self._secret, key, hashlib.sha256).hexdigest()

    def token(self, key: str) -> str | None:
        """The cookie token of `key` if it is one of the keys, else None."""
        encoded = key.encode("utf-8", "surrogateescape")
        found, _ = self.keys.match(encoded)
        return self._token(encoded) if found else None

    def match(self, scope: Scope) -> tuple[bool, str | None]:
        """(found, the key's name) for the key in the query, else the token in the cookie."""
        query = query_key(scope)
        if query is not None:
            return self.keys.match(query.encode("utf-8", "surrogateescape"))
        token = cookie_token(scope)
        for known, name in self._names.items():  # every token, every time: constant time
            if hmac.compare_digest(token, known):
                return True, name
        return False, None


def query_key(scope: Scope) -> str | None:
    """The key in the query string, if there is one (percent-decoded as UTF-8)."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), errors="surrogateescape")
    values = query.get(KEY_QUERY)
    return values[-1] if values else None


def cookie_name(scope: Scope) -> str:
    """The dashboard cookie's name on this server: cookies are the host's, whatever the port,
    so two servers on one host would otherwise overwrite each other's."""
    server = scope.get("server")
    return f"{DASHBOARD_COOKIE}_{server[1]}" if server and server[1] else DASHBOARD_COOKIE


def cookie_token(scope: Scope) -> str:
    name_here = cookie_name(scope)
    for name, value in scope["headers"]:
        if name == b"cookie":
            cookie: SimpleCookie = SimpleCookie()
            try:
                cookie.load(value.decode("latin-1"))
            except CookieError:
                continue
            if name_here in cookie:
                return cookie[name_here].value
    return ""


def redact(path: str) -> str:
    """`path?api_key=KEY` -> `path?api_key=***`, however the name is spelled (`api%5Fkey`)."""
    def masked(m: re.Match[str]) -> str:
        if unquote_plus(m.group(2)) == KEY_QUERY:
            return f"{m.group(1)}{m.group(2)}=***"
        return m.group(0)

    return QUERY_PAIR.sub(masked, path) if "?" in path else path


class RedactKeys(logging.Filter):
    """On uvicorn's access log: a query's API key is written `api_key=***`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True
