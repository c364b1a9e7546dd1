"""The served schema (no fuzzing here: tests/system/test_openapi_schemathesis.py): behind the
key like every route but /health, /docs served, both off with openapi=False; every route in it
with its errors in its API's shape, streams as text/event-stream, no 422 (a 400 here), the
served model names, the links from a created response."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

KEY = "sk-openapi"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def engine(loaded_model: Any) -> Iterator[Any]:
    from radixrt import Engine

    engine = Engine(model=loaded_model, max_total_tokens=2048)
    yield engine
    engine.close()


def client(engine: Any, **options: Any) -> TestClient:
    from radixrt.runtime.server.http_server import create_app

    return TestClient(create_app(engine.tokenizer_manager("smollm2"), **options))


def test_the_schema_and_its_page_are_served_behind_the_key(engine: Any) -> None:
    http = client(engine, api_key=KEY)
    assert http.get("/openapi.json").status_code == 401
    assert http.get("/docs").status_code == 401
    schema = http.get("/openapi.json", headers=AUTH).json()
    page = http.get("/docs", headers=AUTH)
    assert page.status_code == 200 and "/openapi.json" in page.text
    assert set(schema["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    off = client(engine, api_key=KEY, openapi=False)
    assert off.get("/openapi.json", headers=AUTH).status_code == 404
    assert off.get("/docs", headers=AUTH).status_code == 404


def test_every_route_documents_its_answers(engine: Any) -> None:
    http = client(engine, api_key=KEY)
    schema = http.get("/openapi.json", headers=AUTH).json()
    paths = schema["paths"]
    routes = {(method.upper(), route.path) for route in http.app.routes
              for method in getattr(route, "methods", ()) or ()
              if route.path not in ("/openapi.json", "/docs", "/docs/oauth2-redirect")}
    documented = {(method.upper(), path) for path, item in paths.items() for method in item}
    assert routes - {("HEAD", p) for _, p in routes} == documented
    for path, item in paths.items():
        for method, op in item.items():
            responses = op["responses"]
            assert "422" not in responses, (method, path)
            if path != "/health":
                assert "401" in responses, (method, path)
            if "requestBody" in op:
                assert {"400", "413"} <= set(responses), (method, path)
            shape = "AnthropicErrorBody" if path.startswith("/v1/messages") \
                else "OpenAIErrorBody"
            for status, doc in responses.items():
                if status.startswith("4") or status.startswith("5"):
                    ref = doc["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith(shape), (method, path, status)
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses",
                 "/generate"):
        ok = paths[path]["post"]["responses"]["200"]["content"]
        assert set(ok) == {"application/json", "text/event-stream"}
        assert {"408", "429"} <= set(paths[path]["post"]["responses"])
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    shapes = schema["components"]["schemas"]
    assert shapes["ChatRequest"]["properties"]["model"]["enum"] == ["smollm2", "default"]
    assert "HTTPValidationError" not in shapes
    links = paths["/v1/responses"]["post"]["responses"]["200"]["links"]
    assert set(links) == {"GetResponse", "DeleteResponse", "CancelResponse"}


def test_without_keys_nothing_asks_for_one(engine: Any) -> None:
    schema = client(engine).get("/openapi.json").json()
    assert "securitySchemes" not in schema["components"]
    assert all("401" not in op["responses"] for item in schema["paths"].values()
               for op in item.values())
