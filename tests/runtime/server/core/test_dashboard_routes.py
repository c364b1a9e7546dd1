"""The dashboard's routes over a real socket on an in-process Engine: the API key (a header, or
what a browser can bring: the query once, then an HttpOnly cookie that opens nothing but the
dashboard's reads), /debug/radix_tree's bounds, hits and hidden text, /dashboard/stats' history,
and `--disable-dashboard`."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from http_serving import serve_in_thread, wait_idle

from radixrt.runtime.server.core.dashboard_auth import DASHBOARD_COOKIE

API_KEY = "sk-dashboard-key"
SHARED = ("You are the assistant of a travel agency. Answer in one short sentence, name one "
          "place, and never invent prices. ") * 3
SALT = "tenant-b-private-salt"


class Apps:
    def __init__(self, engine: Any, ports: list[int]) -> None:
        self.engine = engine
        self.keyed = httpx.Client(base_url=f"http://127.0.0.1:{ports[0]}", timeout=60)
        self.open = httpx.Client(base_url=f"http://127.0.0.1:{ports[1]}", timeout=60)
        self.off = httpx.Client(base_url=f"http://127.0.0.1:{ports[2]}", timeout=60)
        self.http = self.open  # what http_serving.wait_idle reads

    def complete(self, prompt: str, **extra: Any) -> dict[str, Any]:
        response = self.open.post("/v1/completions", json={
            "model": "default", "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra})
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture(scope="module")
def apps(loaded_model: Any) -> Iterator[Apps]:
    from radixrt import Engine
    from radixrt.runtime.server.http_server import create_app

    engine = Engine(model=loaded_model, max_total_tokens=4096, check_integrity=True)
    manager = engine.tokenizer_manager("smollm2")
    ports, stop = serve_in_thread([
        create_app(manager, api_key=API_KEY),
        create_app(manager, dashboard_show_text=True),
        create_app(manager, dashboard=False)])
    served = Apps(engine, ports)
    yield served
    for client in (served.keyed, served.open, served.off):
        client.close()
    stop()
    engine.check_integrity()


def test_a_browser_brings_the_key_once_and_the_cookie_opens_only_the_dashboard(
        apps: Apps) -> None:
    http = apps.keyed
    for path in ("/dashboard", "/dashboard/stats", "/dashboard/dashboard.js", "/debug/radix_tree"):
        assert http.get(path).status_code == 401, path
    assert http.get("/dashboard", params={"api_key": "wrong"}).status_code == 401
    for odd in ("%FF", "%E2%82%AC"):  # not the key, and not a 500 either
        assert http.get(f"/dashboard?api_key={odd}").status_code == 401
    given = http.get("/dashboard", params={"api_key": API_KEY}, follow_redirects=False)
    assert given.status_code == 303 and given.headers["location"] == "/dashboard"
    cookie = given.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie, cookie
    assert API_KEY not in cookie and "Secure" not in cookie  # a token; plain http here
    [(name, token)] = given.cookies.items()  # the cookie of this server (its port)
    assert name == f"{DASHBOARD_COOKIE}_{http.base_url.port}"
    with httpx.Client(base_url=http.base_url, cookies={name: token}) as browser:
        check_cookie_reads(browser)
    with httpx.Client(base_url=http.base_url, cookies={name: API_KEY}) as browser:
        assert browser.get("/dashboard/stats").status_code == 401  # the raw key is no token
    header = {"Authorization": f"Bearer {API_KEY}"}
    # a good header with a junk query key: the page, and no cookie for the junk
    page = http.get("/dashboard", params={"api_key": "junk"}, headers=header,
                    follow_redirects=False)
    assert page.status_code == 200 and "set-cookie" not in page.headers
    assert http.get("/debug/radix_tree", headers=header).status_code == 200
    assert http.get("/metrics", params={"api_key": API_KEY}).status_code == 401
    # every refusal above is counted, as the alerting rules read it
    scraped = http.get("/metrics", headers=header).text
    refused = re.search(r'^radixrt_rejected_requests_total\{status="401"\} (\S+)$', scraped,
                        re.MULTILINE)
    assert refused is not None and float(refused.group(1)) == 11


def check_cookie_reads(http: httpx.Client) -> None:
    """What a browser holding the dashboard's cookie may open, and may not."""
    page = http.get("/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="/dashboard/dashboard.js"' in page.text
    script = http.get("/dashboard/dashboard.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "http://" not in script.text.replace("http://www.w3.org/2000/svg", "")  # offline
    assert http.get("/dashboard/stats").status_code == 200
    assert http.get("/debug/radix_tree").status_code == 200
    assert http.get("/dashboard/secrets.txt").status_code == 404
    # the cookie (or the query) is a key for the dashboard's reads only
    assert http.get("/server_info").status_code == 401
    refused = http.post("/v1/completions",
                        json={"model": "default", "prompt": "hi", "max_tokens": 1})
    assert refused.status_code == 401


def test_the_tree_shows_the_shared_prefix_with_its_hits(apps: Apps) -> None:
    for question in ("Where should I go in May?", "A city for a weekend?",
                     "Somewhere warm in winter?"):
        apps.complete(SHARED + question)
    apps.complete(SHARED + "A salted question?", cache_salt=SALT)
    wait_idle(apps)  # type: ignore[arg-type]
    view = apps.open.get("/debug/radix_tree", params={"depth": 3, "limit": 50}).json()
    nodes = view["nodes"]
    assert view["complete"] and len(nodes) <= 50
    roots = [n for n in nodes if n["depth"] == 0]
    assert {r["namespace"] for r in roots} >= {"default"}
    assert all(SALT not in n["namespace"] for n in nodes)
    salted = [r for r in roots if r["namespace"] != "default"]
    assert len(salted) == 1 and salted[0]["namespace"].startswith("salt:")
    # a salted namespace's prompts are never shown, even with --dashboard-show-text
    assert all(n["text"] is None for n in nodes if n["namespace"] != "default")
    shared = max((n for n in nodes if n["depth"] == 1 and n["namespace"] == "default"),
                 key=lambda n: n["subtree_tokens"])
    assert shared["hits"] >= 2 and shared["tokens"] >= 60 and shared["children"] >= 3
    assert "travel agency" in shared["text"] and shared["head_ids"] == []
    assert shared["tier"] == "device" and shared["locks"] == 0
    # without --dashboard-show-text: the same tree, no text
    hidden = apps.keyed.get("/debug/radix_tree", params={"depth": 3, "limit": 50},
                            headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert [n["hits"] for n in hidden["nodes"]] == [n["hits"] for n in nodes]
    assert all(n["text"] is None and n["head_ids"] == [] for n in hidden["nodes"])


def test_snapshots_are_taken_one_at_a_time_and_spaced(apps: Apps) -> None:
    """Five different questions at once (each needs its own snapshot of the tree) are answered
    one after another, TREE_VIEW_INTERVAL_S apart: a caller cannot stall the scheduler by
    asking many."""
    from radixrt.runtime.tokenizer.tokenizer_manager import TREE_VIEW_INTERVAL_S

    def ask(limit: int) -> int:
        return apps.open.get("/debug/radix_tree", params={"limit": limit}).status_code

    time.sleep(TREE_VIEW_INTERVAL_S)  # none taken just before
    started = time.monotonic()
    with ThreadPoolExecutor(5) as pool:
        assert list(pool.map(ask, range(300, 305))) == [200] * 5
    assert time.monotonic() - started >= 4 * TREE_VIEW_INTERVAL_S


@pytest.mark.parametrize("query", [{"depth": 0}, {"depth": 17}, {"limit": 0},
                                   {"limit": 1001}, {"depth": "deep"}])
def test_tree_bounds_are_a_400_naming_the_field(apps: Apps, query: dict[str, Any]) -> None:
    response = apps.open.get("/debug/radix_tree", params=query)
    assert response.status_code == 400
    assert next(iter(query)) in response.json()["error"]["message"]


def test_stats_count_what_finished(apps: Apps) -> None:
    before = apps.open.get("/dashboard/stats").json()["history"]["buckets"]
    out = apps.complete("Count to three:", max_tokens=5)
    stats = apps.open.get("/dashboard/stats").json()
    buckets = stats["history"]["buckets"]
    assert stats["model"] == "smollm2" and stats["show_text"] is True
    assert stats["info"]["kv_total"] > 0 and "running_by_tenant" in stats["info"]
    assert 1 <= len(buckets) <= 72 and stats["history"]["bucket_s"] == 5.0

    def total(bs: list[dict[str, Any]], key: str) -> float:
        return sum(b[key] for b in bs)

    assert total(buckets, "requests") == total(before, "requests") + 1
    assert (total(buckets, "generated_tokens") - total(before, "generated_tokens")
            == out["usage"]["completion_tokens"])
    assert total(buckets, "ttft_count") == total(before, "ttft_count") + 1
    assert sum(b["by_priority"].get("0", 0) for b in buckets[-2:]) >= 1


def test_disable_dashboard_serves_none_of_it(apps: Apps) -> None:
    for path in ("/dashboard", "/dashboard/stats", "/debug/radix_tree"):
        assert apps.off.get(path).status_code == 404, path
    assert apps.off.get("/server_info").status_code == 200
