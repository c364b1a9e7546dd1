"""The pooling surface over HTTP (an Engine served in-process): the official openai client's
embeddings.create (float and base64), the Cohere / Jina rerank shape, vLLM's /classify and
SGLang's reward scoring; every bad input a 4xx that names the problem, after which the server
goes on serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
from http_serving import serve_in_thread
from pooling_models import build_pooling_models

from radixrt import Engine
from radixrt.runtime.models import load_model
from radixrt.runtime.server.http_server import create_app
from radixrt.runtime.tokenizer.pooling_inputs import MAX_POOLING_INPUTS

pytestmark = pytest.mark.model

TEXTS = ["The cat sat on the mat.", "Embeddings map each text to one vector.", "Short."]
QUERY = "Which animal sat on the mat?"
DOCS = ["The cat sat on the mat.", "Stock prices fell on Tuesday.", "A dog slept by the door."]
NAMES = {"qwen2-embed": "tiny-embed", "qwen3-rerank": "tiny-rerank",
         "qwen2-classify": "tiny-classify"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Iterator[dict]:
    folders = build_pooling_models(tmp_path_factory.mktemp("pooling_http"), tokenizer,
                                   tuple(NAMES))
    engines = {name: Engine(load_model(str(folders[name])), check_integrity=True,
                            max_total_tokens=4096,
                            task="rerank" if name == "qwen3-rerank" else "auto")
               for name in NAMES}
    # the references: the same engines called directly, before they are served
    refs = {"embed": engines["qwen2-embed"].embed(TEXTS),
            "rerank": engines["qwen3-rerank"].rerank(QUERY, DOCS),
            "classify": engines["qwen2-classify"].classify(TEXTS)}
    ports, stop = serve_in_thread([create_app(engines[n].tokenizer_manager(NAMES[n]))
                                   for n in NAMES])
    urls = {name: f"http://127.0.0.1:{port}" for name, port in zip(NAMES, ports)}
    yield {"urls": urls, "refs": refs, "folders": folders, "engines": engines}
    stop()
    for e in engines.values():
        e.check_integrity()
        e.close()


def client(served: dict, name: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served['urls'][name]}/v1", api_key="unused", max_retries=0)


def http(served: dict, name: str) -> httpx.Client:
    return httpx.Client(base_url=served["urls"][name], timeout=120)


def test_openai_client_embeddings(served: dict) -> None:
    """float and base64 (the client's default, decoded by the client) give the same vectors,
    those of the Engine; usage counts the prompt tokens; `dimensions` cuts and normalizes."""
    c = client(served, "qwen2-embed")
    ref = torch.tensor(served["refs"]["embed"])
    for fmt in ("float", "base64"):
        kwargs: dict = {} if fmt == "base64" else {"encoding_format": "float"}
        res = c.embeddings.create(model="tiny-embed", input=TEXTS, **kwargs)
        got = torch.tensor([d.embedding for d in res.data])
        assert [d.index for d in res.data] == [0, 1, 2]
        assert torch.allclose(got, ref, atol=1e-5), fmt
        assert res.usage.prompt_tokens > len(TEXTS)
    one = c.embeddings.create(model="tiny-embed", input=TEXTS[0], encoding_format="float")
    assert torch.allclose(torch.tensor(one.data[0].embedding), ref[0], atol=1e-5)
    cut = c.embeddings.create(model="tiny-embed", input=TEXTS, dimensions=8,
                              encoding_format="float")
    expect = torch.nn.functional.normalize(ref[:, :8], dim=-1)
    assert torch.allclose(torch.tensor([d.embedding for d in cut.data]), expect, atol=1e-5)


def test_rerank_in_the_cohere_and_jina_shape(served: dict) -> None:
    scores = served["refs"]["rerank"]
    order = sorted(range(len(DOCS)), key=lambda i: -scores[i])
    with http(served, "qwen3-rerank") as h:
        for path in ("/v1/rerank", "/v2/rerank", "/rerank"):
            body = h.post(path, json={"model": "tiny-rerank", "query": QUERY,
                                      "documents": DOCS}).json()
            assert [r["index"] for r in body["results"]] == order, body
            assert [r["relevance_score"] for r in body["results"]] == pytest.approx(
                [scores[i] for i in order], abs=1e-5)
            assert body["results"][0]["document"] == {"text": DOCS[order[0]]}
            assert body["usage"]["prompt_tokens"] > 0
        top = h.post("/v2/rerank", json={
            "model": "tiny-rerank", "query": QUERY, "top_n": 2, "return_documents": False,
            "documents": [{"text": d} for d in DOCS]}).json()
        assert [r["index"] for r in top["results"]] == order[:2]
        assert "document" not in top["results"][0]


def test_classify_in_vllm_and_sglang_shapes(served: dict) -> None:
    probs = served["refs"]["classify"]
    with http(served, "qwen2-classify") as h:
        body = h.post("/classify", json={"model": "tiny-classify", "input": TEXTS}).json()
        assert [d["probs"] for d in body["data"]] == [pytest.approx(p, abs=1e-5) for p in probs]
        labels = ["neg", "neutral", "pos"]
        assert [d["label"] for d in body["data"]] == [labels[max(range(3), key=p.__getitem__)]
                                                      for p in probs]
        assert body["data"][0]["num_classes"] == 3
        sglang = h.post("/classify", json={"text": TEXTS[:2]}).json()  # SGLang's reward shape
        assert len(sglang) == 2 and len(sglang[0]["embedding"]) == 3
        assert torch.tensor(sglang[0]["embedding"]).softmax(-1).tolist() == pytest.approx(
            probs[0], abs=1e-5)
        one = h.post("/classify", json={"text": TEXTS[1]}).json()  # one text: one answer
        assert set(one) == {"embedding", "meta_info"} and one["meta_info"]["prompt_tokens"] > 0
        assert torch.tensor(one["embedding"]).softmax(-1).tolist() == pytest.approx(
            probs[1], abs=1e-5)
        ids = served["engines"]["qwen2-classify"].tokenizer.encode(TEXTS[1])
        by_ids = h.post("/classify", json={"input_ids": ids}).json()
        assert by_ids["embedding"] == pytest.approx(one["embedding"], abs=1e-5)
        refused = h.post("/v1/completions", json={"model": "tiny-classify", "prompt": "Hi"})
        assert refused.status_code == 400 and "no LM head" in refused.text


@pytest.mark.parametrize("name, path, body, status, message", [
    ("qwen2-embed", "/v1/embeddings", {"model": "tiny-embed", "input": []}, 400,
     "input is empty"),
    ("qwen2-embed", "/v1/embeddings",
     {"model": "tiny-embed", "input": ["a"] * (MAX_POOLING_INPUTS + 1)}, 400,
     f"at most {MAX_POOLING_INPUTS}"),
    ("qwen2-embed", "/v1/embeddings", {"model": "tiny-embed", "input": "a", "dimensions": 65},
     400, "dimensions=65 is more than the model's 64"),
    ("qwen2-embed", "/v1/embeddings", {"model": "tiny-embed", "input": "a", "dimensions": 0},
     400, "dimensions"),
    ("qwen2-embed", "/v1/embeddings", {"model": "other", "input": "a"}, 400, "not served"),
    ("qwen2-embed", "/v1/embeddings", {"model": "tiny-embed", "input": [[1, 10 ** 9]]}, 400,
     "outside the vocabulary"),
    ("qwen2-embed", "/v1/embeddings", {"model": "tiny-embed", "input": "a" * 30000}, 400,
     "context length"),
    ("qwen2-embed", "/v1/rerank", {"model": "tiny-embed", "query": "q", "documents": ["d"]},
     400, "does not rerank"),
    ("qwen2-embed", "/classify", {"model": "tiny-embed", "input": "a"}, 400,
     "no classification head"),
    ("qwen3-rerank", "/v1/rerank", {"model": "tiny-rerank", "query": "q", "documents": []},
     400, "documents is empty"),
    ("qwen3-rerank", "/v1/rerank", {"model": "tiny-rerank", "query": "q", "documents": ["d"],
                                    "top_n": 0}, 400, "top_n"),
    ("qwen2-classify", "/classify", {"model": "tiny-classify"}, 400, "give one of `input`"),
    ("qwen2-classify", "/classify", {"model": "tiny-classify", "input": "a", "text": "b"}, 400,
     "give one of `input`"),
    ("qwen3-rerank", "/v1/rerank", {"model": "tiny-rerank", "query": "q " * 600,
                                    "documents": ["d"] * 2048}, 400, "repeated for 2048"),
])
def test_bad_input_is_a_4xx_and_the_server_goes_on(served: dict, name: str, path: str,
                                                   body: dict, status: int,
                                                   message: str) -> None:
    with http(served, name) as h:
        res = h.post(path, json=body)
        assert res.status_code == status, res.text
        assert message in res.text, res.text
        # the same server answers its next request as before
        if name == "qwen2-embed":
            again = h.post("/v1/embeddings", json={"model": "tiny-embed", "input": TEXTS[0]})
            got = again.json()["data"][0]["embedding"]
            assert got == pytest.approx(served["refs"]["embed"][0], abs=1e-5)
        elif name == "qwen3-rerank":
            again = h.post("/v1/rerank", json={"model": "tiny-rerank", "query": QUERY,
                                               "documents": DOCS})
            got = sorted(again.json()["results"], key=lambda r: r["index"])
            assert [r["relevance_score"] for r in got] == pytest.approx(
                served["refs"]["rerank"], abs=1e-5)
        else:
            again = h.post("/classify", json={"model": "tiny-classify", "input": TEXTS})
            assert [d["probs"] for d in again.json()["data"]] == [
                pytest.approx(p, abs=1e-5) for p in served["refs"]["classify"]]
