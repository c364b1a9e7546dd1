"""`radixrt serve --task rerank` on the default model, as users call it: the official openai
client's embeddings.create (float and base64), LangChain's OpenAIEmbeddings and a Cohere-shaped
rerank against transformers
on the same GGUF weights, the DSL's rx.embed over ZeroMQ and over HTTP, generation from the same
server, and the pooling figures on /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
from test_server import API_KEY, Server, free_port

import radixrt as rx
from radixrt.runtime.models.pooling_config import DEFAULT_RERANK_INSTRUCTION, RERANK_SYSTEM

pytestmark = pytest.mark.slow  # a server as real processes

TEXTS = ["The capital of France is Paris.", "Photosynthesis turns light into sugar.",
         "My favourite colour is green."]
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital and largest city of France.",
        "Bananas are rich in potassium.", "Berlin is the capital of Germany."]
COSINE = 1e-4  # the served model multiplies the packed 4-bit blocks; the reference dequantizes
SCORE = 2e-3


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    dsl_port = free_port()
    srv = Server("--max-total-tokens", "4096", "--api-key", API_KEY, "--log-level", "warning",
                 "--check-integrity", "--dsl-port", str(dsl_port), "--task", "rerank")
    srv.dsl_port = dsl_port
    yield srv
    srv.stop()


def hf_embedding(hf_model: Any, tokenizer: Any, text: str) -> torch.Tensor:
    """The last token's final hidden state (after the last norm), unit length."""
    with torch.no_grad():
        out = hf_model(torch.tensor([tokenizer.encode(text)]), output_hidden_states=True)
    return torch.nn.functional.normalize(out.hidden_states[-1][0, -1].float(), dim=-1)


def hf_rerank(hf_model: Any, tokenizer: Any, query: str, doc: str) -> float:
    messages = [{"role": "system", "content": RERANK_SYSTEM},
                {"role": "user", "content": f"<Instruct>: {DEFAULT_RERANK_INSTRUCTION}\n"
                                            f"<Query>: {query}\n<Document>: {doc}"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=False)
    no, yes = (tokenizer.encode(w, add_special_tokens=False)[0] for w in ("no", "yes"))
    with torch.no_grad():
        logits = hf_model(torch.tensor([tokenizer.encode(text, add_special_tokens=False)]))
    return torch.softmax(logits.logits[0, -1, [no, yes]].float(), -1)[1].item()


def close(got: list[float], ref: torch.Tensor) -> bool:
    cos = torch.nn.functional.cosine_similarity(torch.tensor(got), ref, dim=0).item()
    return 1 - cos < COSINE


def test_openai_client_embeddings_equal_transformers(server: Server, hf_model: Any,
                                                      tokenizer: Any) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    refs = [hf_embedding(hf_model, tokenizer, t) for t in TEXTS]
    for kwargs in ({}, {"encoding_format": "float"}):  # the client asks for base64 by default
        res = client.embeddings.create(model="default", input=TEXTS, **kwargs)
        assert len(res.data) == 3 and res.usage.prompt_tokens == sum(
            len(tokenizer.encode(t)) for t in TEXTS)
        assert all(close(d.embedding, r) for d, r in zip(res.data, refs, strict=True))
    # generation from the same server and weights
    out = client.completions.create(model="default", prompt="Hello", max_tokens=4)
    assert out.usage.completion_tokens == 4


def test_langchain_openai_embeddings(server: Server, hf_model: Any, tokenizer: Any) -> None:
    """LangChain's OpenAIEmbeddings pointed at the server (token-length checks off: they need
    tiktoken's files from the network)."""
    from langchain_openai import OpenAIEmbeddings

    emb = OpenAIEmbeddings(model="default", base_url=f"{server.url}/v1", api_key=API_KEY,
                           check_embedding_ctx_length=False, max_retries=0)
    docs = emb.embed_documents(TEXTS)
    assert all(close(d, hf_embedding(hf_model, tokenizer, t)) for d, t in zip(docs, TEXTS))
    assert close(emb.embed_query(QUERY), hf_embedding(hf_model, tokenizer, QUERY))


def test_rerank_equals_transformers_yes_no(server: Server, hf_model: Any,
                                           tokenizer: Any) -> None:
    refs = [hf_rerank(hf_model, tokenizer, QUERY, d) for d in DOCS]
    res = httpx.post(f"{server.url}/v2/rerank", headers=server.headers(), timeout=120,
                     json={"model": "default", "query": QUERY, "documents": DOCS})
    assert res.status_code == 200, res.text
    got = {r["index"]: r["relevance_score"] for r in res.json()["results"]}
    assert [got[i] for i in range(3)] == pytest.approx(refs, abs=SCORE)
    order = [r["index"] for r in res.json()["results"]]
    assert order == sorted(range(3), key=lambda i: -got[i])


@rx.function
def describe(s: Any, topic: str) -> None:
    s += "Here is a short note about " + topic + "."
    s += rx.embed("note")  # the program's text so far
    s += rx.embed("topic", text=topic)


def test_the_dsl_embeds_over_zeromq_and_http(server: Server) -> None:
    """rx.embed of the program's text equals the embeddings route's vector of that text,
    over both endpoints; text= embeds the given text instead."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    note = "Here is a short note about radix trees."

    def served(text: str) -> torch.Tensor:
        got = client.embeddings.create(model="default", input=text, encoding_format="float")
        return torch.tensor(got.data[0].embedding)

    for backend in (rx.RuntimeEndpoint(f"tcp://127.0.0.1:{server.dsl_port}", api_key=API_KEY),
                    rx.RuntimeEndpoint(server.url, api_key=API_KEY)):
        try:
            state = describe.run(topic="radix trees", backend=backend)
            assert state.text() == note  # embed appends nothing
            assert close(state["note"], served(note))
            assert close(state["topic"], served("radix trees"))
        finally:
            backend.close()
    metrics = httpx.get(f"{server.url}/metrics", headers=server.headers(), timeout=30).text
    line = next(x for x in metrics.splitlines()
                if x.startswith('radixrt_pooling_requests_total{task="embed"}'))
    assert float(line.split()[-1]) >= 4
    assert 'radixrt_pooling_requests_total{task="classify"}' in metrics  # the rerank test's
    server.wait_idle()
