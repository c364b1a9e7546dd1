"""What a browser may bring as the API key (server/core/dashboard_auth.py): only GET/HEAD
requests to the dashboard's paths; the key in the `api_key` query (any bytes, never a 500), or
the cookie's token, an HMAC of the key under this process's secret (never the key, void for
another process); and the access log never shows a query's key."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from radixrt.runtime.server.core.dashboard_auth import (
    DASHBOARD_COOKIE,
    BrowserKeys,
    RedactKeys,
    cookie_name,
    cookie_token,
    is_dashboard_read,
    query_key,
    redact,
)
from radixrt.runtime.server.core.tenants import ApiKeys

KEYS = ApiKeys(((None, b"sk-1"), ("alice", "sk-é".encode())))


def scope(path: str = "/dashboard", method: str = "GET", query: bytes = b"",
          cookie: str | None = None) -> dict[str, Any]:
    headers = [(b"cookie", cookie.encode())] if cookie is not None else []
    return {"type": "http", "path": path, "method": method, "query_string": query,
            "headers": headers}


@pytest.mark.parametrize(("path", "method", "allowed"), [
    ("/dashboard", "GET", True), ("/dashboard/stats", "GET", True),
    ("/dashboard/dashboard.js", "HEAD", True), ("/debug/radix_tree", "GET", True),
    ("/dashboard", "POST", False), ("/debug/radix_tree", "DELETE", False),
    ("/dashboardx", "GET", False), ("/debug/radix_treehouse", "GET", False),
    ("/server_info", "GET", False), ("/metrics", "GET", False),
    ("/v1/completions", "POST", False),
])
def test_only_the_dashboards_reads(path: str, method: str, allowed: bool) -> None:
    assert is_dashboard_read(scope(path, method)) is allowed


def test_the_key_in_the_query() -> None:
    browser = BrowserKeys(KEYS)
    assert browser.match(scope(query=b"api_key=sk-1")) == (True, None)
    assert browser.match(scope(query=b"api_key=sk-%C3%A9")) == (True, "alice")  # UTF-8
    assert browser.match(scope(query=b"api_key=sk-2")) == (False, None)
    for odd in (b"api_key=%FF", b"api_key=%E2%82%AC", b"api_key=%00", b"api_key="):
        assert browser.match(scope(query=odd)) == (False, None)  # refused, never raised
    assert query_key(scope(query=b"x=1&api_key=a%2Bb")) == "a+b"
    assert query_key(scope()) is None


def test_the_cookie_holds_a_token_of_this_process_never_the_key() -> None:
    browser = BrowserKeys(KEYS)
    token = browser.token("sk-é")
    assert token is not None and "sk-" not in token
    assert browser.token("sk-2") is None  # no cookie for a wrong key
    assert browser.match(scope(cookie=f"x=1; {DASHBOARD_COOKIE}={token}")) == (True, "alice")
    assert browser.match(scope(cookie=f"{DASHBOARD_COOKIE}=sk-1")) == (False, None)
    assert BrowserKeys(KEYS).match(scope(cookie=f"{DASHBOARD_COOKIE}={token}")) == (False, None)
    assert cookie_token(scope(cookie='bad"cookie;;==')) == ""
    assert cookie_token(scope()) == ""


def test_each_server_of_a_host_has_its_own_cookie() -> None:
    browser = BrowserKeys(KEYS)
    token = browser.token("sk-1")
    here = {**scope(cookie=f"{DASHBOARD_COOKIE}_8000={token}"), "server": ("127.0.0.1", 8000)}
    assert cookie_name(here) == f"{DASHBOARD_COOKIE}_8000"
    assert browser.match(here) == (True, None)
    there = {**here, "server": ("127.0.0.1", 8001)}  # another server's cookie: not this one's
    assert browser.match(there) == (False, None)


def test_the_access_log_never_shows_a_key() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", "/dashboard?x=1&api_key=sk-secret&y=2",
                                "1.1", 303), None)
    assert RedactKeys().filter(record)
    assert record.getMessage() == ('127.0.0.1:5 - "GET /dashboard?x=1&api_key=***&y=2 '
                                   'HTTP/1.1" 303')
    # however the name is spelled, as long as the server would read it as the key
    for spelled in ("api%5Fkey", "api%5fkey", "%61pi_key"):
        assert query_key(scope(query=f"{spelled}=sk-1".encode())) == "sk-1"
        assert redact(f"/dashboard?{spelled}=sk-1&a=b") == f"/dashboard?{spelled}=***&a=b"
    assert redact("/v1/models?api_keys=1") == "/v1/models?api_keys=1"
    assert redact("/dashboard") == "/dashboard"
