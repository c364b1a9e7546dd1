"""The operator's live page: GET /dashboard (plain static files from dashboard_static/, no build
step, nothing fetched from elsewhere), its data GET /dashboard/stats (the runtime's counters
and the last minutes of finished requests: dashboard_feed.py) and GET /debug/radix_tree (the
top of the radix tree, bounded: tree_messages.py). All of them are behind the API key like
every route; a browser may bring the key as dashboard_auth.py says. `radixrt serve
--disable-dashboard` serves none of them; each node's first words are shown only with
`--dashboard-show-text` (prompts may be private)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from fastapi import FastAPI, HTTPException, Query, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from radixrt.runtime.server.core.dashboard_auth import (
    DASHBOARD_PATH,
    KEY_QUERY,
    BrowserKeys,
    cookie_name,
)
from radixrt.runtime.server.core.dashboard_feed import DashboardFeed
from radixrt.runtime.server.core.http_openapi import documented
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager
from radixrt.runtime.tree_messages import (
    DEFAULT_TREE_DEPTH,
    DEFAULT_TREE_NODES,
    MAX_TREE_DEPTH,
    MAX_TREE_NODES,
)

STATIC_DIR = Path(__file__).with_name("dashboard_static")
STATIC_FILES = {  # what /dashboard/<name> serves, and as what
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
PAGE = "index.html"
# the page and its script come only from this server; data only from its own routes
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def add_dashboard_routes(app: FastAPI, manager: TokenizerManager, browser: BrowserKeys | None,
                         show_text: bool) -> None:
    """browser: the server's keys as a browser brings them (None: no keys), so a key brought in
    the query becomes the cookie's token."""
    feed = DashboardFeed(manager)
    files = {name: (STATIC_DIR / name).read_bytes() for name in [PAGE, *STATIC_FILES]}

    @app.get(DASHBOARD_PATH, response_class=HTMLResponse, summary="The live page",
             responses={303: {"description": "The key came in the query (`?api_key=KEY`): it "
                                             "is set as an HttpOnly cookie and the page is "
                                             "opened without it"}})
    async def page(request: Request) -> Response:
        """The operator's live page (HTML): throughput, latency, the KV pool and its tiers,
        tenants and the radix tree, refreshed every 2 s."""
        key = request.query_params.get(KEY_QUERY)
        token = browser.token(key) if browser is not None and key else None
        if token is not None:  # the key came in the query: a cookie instead, off the URL
            moved = RedirectResponse(DASHBOARD_PATH, status_code=303)
            moved.set_cookie(cookie_name(request.scope), token, httponly=True,
                             samesite="strict", path="/", secure=request.url.scheme == "https")
            return moved
        return Response(files[PAGE], media_type="text/html; charset=utf-8",
                        headers=PAGE_HEADERS)

    @app.get(DASHBOARD_PATH + "/stats", summary="The dashboard's figures")
    async def stats() -> dict[str, Any]:
        """The runtime's counters (as /server_info) and the last minutes of finished
        requests in buckets (throughput, TTFT, TPOT, tenants, priorities)."""
        return {"model": manager.model_name, "info": await manager.server_info(),
                "history": feed.history(), "show_text": show_text}

    @app.get(DASHBOARD_PATH + "/{name}", summary="The live page's script and style",
             responses=documented(None, (404,)))
    async def static(name: str) -> Response:
        """dashboard.js and dashboard.css (404 for any other name)."""
        if name not in STATIC_FILES:
            raise HTTPException(404, f"no dashboard file {name!r}")
        return Response(files[name], media_type=STATIC_FILES[name], headers=PAGE_HEADERS)

    @app.get("/debug/radix_tree", summary="The top of the radix tree")
    async def radix_tree(
        depth: int = Query(DEFAULT_TREE_DEPTH, ge=1, le=MAX_TREE_DEPTH,
                           description="levels below each namespace's root"),
        limit: int = Query(DEFAULT_TREE_NODES, ge=1, le=MAX_TREE_NODES,
                           description="nodes in the answer: the largest subtrees"),
    ) -> Response:
        """The largest subtrees of the radix tree (tokens, hits, tier, locks per node); the
        text of each node's first tokens only with `radixrt serve --dashboard-show-text`."""
        view = await manager.radix_tree(depth, limit, show_text)
        return Response(msgspec.json.encode(view), media_type="application/json")
