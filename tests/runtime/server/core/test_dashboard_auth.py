"""What a browser may bring as the API key (server/core/dashboard_auth.py): only GET/HEAD
requests to the dashboard's paths, the key in the `api_key` query or the dashboard's cookie."""

from __future__ import annotations

from typing import Any

import pytest

from radixrt.runtime.server.core.dashboard_auth import (
    DASHBOARD_COOKIE,
    browser_key,
    is_dashboard_read,
)


def scope(path: str, method: str = "GET", query: bytes = b"",
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


def test_the_key_from_the_query_or_the_cookie() -> None:
    assert browser_key(scope("/dashboard", query=b"api_key=sk-1")) == b"sk-1"
    assert browser_key(scope("/dashboard", query=b"api_key=a%2Bb%3D")) == b"a+b="
    assert browser_key(scope("/dashboard", cookie=f"x=1; {DASHBOARD_COOKIE}=sk-2")) == b"sk-2"
    assert browser_key(scope("/dashboard", query=b"api_key=q",
                             cookie=f"{DASHBOARD_COOKIE}=c")) == b"q"
    assert browser_key(scope("/dashboard")) == b""
    assert browser_key(scope("/dashboard", cookie="other=1")) == b""
    assert browser_key(scope("/dashboard", cookie='bad"cookie;;==')) == b""
