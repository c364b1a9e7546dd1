"""How a browser shows the API key to the dashboard's routes: a browser cannot add an
`Authorization` header when it opens a page, so GET requests to the dashboard's paths (and only
those, and only reading) may carry the key as the `api_key` query parameter (opening
`/dashboard?api_key=KEY` once) or in the cookie that answer sets (HttpOnly, SameSite=Strict:
never sent by another site's page, never readable by a script)."""

from __future__ import annotations

from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from starlette.types import Scope

DASHBOARD_PATH = "/dashboard"
DASHBOARD_PATHS = (DASHBOARD_PATH, "/debug/radix_tree")  # and what is below them
DASHBOARD_COOKIE = "radixrt_dashboard_key"
KEY_QUERY = "api_key"


def is_dashboard_read(scope: Scope) -> bool:
    path = scope["path"]
    return scope.get("method") in ("GET", "HEAD") and any(
        path == p or path.startswith(p + "/") for p in DASHBOARD_PATHS)


def browser_key(scope: Scope) -> bytes:
    """The key a dashboard read carries in its query or its cookie (b"" if none)."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if query.get(KEY_QUERY):
        return query[KEY_QUERY][-1].encode("latin-1")
    for name, value in scope["headers"]:
        if name == b"cookie":
            cookie: SimpleCookie = SimpleCookie()
            try:
                cookie.load(value.decode("latin-1"))
            except CookieError:
                continue
            if DASHBOARD_COOKIE in cookie:
                return cookie[DASHBOARD_COOKIE].value.encode("latin-1")
    return b""
