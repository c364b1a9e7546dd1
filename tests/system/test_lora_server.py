"""`radixrt serve --lora-paths` with the default model and a random PEFT adapter, as users call
it: the official openai client with model="<adapter>", /v1/models listing the adapter with its
base as parent, SGLang's /generate with lora_path, the DSL's gen(lora=...), adapters loaded and
unloaded while serving (POST /load_lora_adapter, /unload_lora_adapter and vLLM's /v1/
spellings), and bad adapters refused with a 4xx while the server goes on serving. The reference
is transformers + PEFT on the same GGUF weights."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from lora_adapters import make_adapter
from test_server import API_KEY, Server, free_port
from tiny_models import hf_logprobs

import radixrt as rx

pytestmark = pytest.mark.slow  # a server as real processes

PROMPT = "The three primary colors are"
MAX_TOKENS = 8
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def adapters(hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lora_default")
    refs = {"sql": make_adapter(copy.deepcopy(hf_model), root / "sql", "attn-r4", 7, std=0.05),
            "poet": make_adapter(copy.deepcopy(hf_model), root / "poet", "all-r8-rslora", 8,
                                 std=0.05)}
    return {"root": root, "refs": {**refs, None: hf_model}}


@pytest.fixture(scope="module")
def server(adapters: dict[str, Any]) -> Iterator[Server]:
    dsl_port = free_port()
    srv = Server("--lora-paths", f"sql={adapters['root'] / 'sql'}", "--max-lora-rank", "8",
                 "--max-total-tokens", "4096", "--api-key", API_KEY, "--log-level", "warning",
                 "--check-integrity", "--dsl-port", str(dsl_port))
    srv.dsl_port = dsl_port
    yield srv
    srv.stop()


def post(srv: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=srv.headers(), timeout=120)


def assert_reference(ids: list[int], tokens: list[int], logprobs: list[float],
                     ref: Any, label: str) -> None:
    scores = hf_logprobs(ref, ids + tokens)
    for i, (token, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        row = scores[len(ids) - 1 + i]
        assert abs(lp - row[token].item()) < TOLERANCE, (label, i)
        top2 = row.topk(2).values
        if top2[0] - top2[1] < TOLERANCE:
            return  # a near-tie: the rounding may pick either token
        assert int(row.argmax()) == token, (label, i)


def completion(srv: Server, model: str) -> tuple[list[int], list[int], list[float], str]:
    """Greedy through /generate with lora_path (None for the base model): (prompt ids, output
    ids, their logprobs, text); the openai client with model=<adapter> answers the same text."""
    native = post(srv, "/generate", {
        "text": PROMPT, "lora_path": None if model == "default" else model,
        "return_logprob": True, "logprob_start_len": 0,
        "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0,
                            "ignore_eos": True}})
    if native.status_code != 200:
        raise ValueError(native.text)
    body = native.json()
    meta = body["meta_info"]
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0)
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert out.choices[0].text == body["text"], (model, out.choices[0].text, body["text"])
    return ([t[1] for t in meta["input_token_logprobs"]],
            [t[1] for t in meta["output_token_logprobs"]],
            [t[0] for t in meta["output_token_logprobs"]], body["text"])


def test_openai_client_serves_the_adapter_as_a_model(server: Server,
                                                     adapters: dict[str, Any]) -> None:
    models = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY).models.list().data
    cards = {m.id: m.model_extra for m in models}
    assert cards["sql"]["parent"] == models[0].id and cards["sql"]["root"].endswith("sql")
    ids, tokens, logprobs, text = completion(server, "sql")
    assert_reference(ids, tokens, logprobs, adapters["refs"]["sql"], "sql")
    base = completion(server, "default")
    assert_reference(base[0], base[1], base[2], adapters["refs"][None], "base")
    assert base[3] != text  # the adapter changes the answer
    server.wait_idle()


def test_the_dsl_runs_a_gen_under_an_adapter(server: Server) -> None:
    @rx.function
    def answer(s: Any) -> None:
        s += PROMPT
        s += rx.gen("under", max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, lora="sql")
        s += rx.gen("base", max_tokens=4, temperature=0, ignore_eos=True)

    endpoint = rx.RuntimeEndpoint(f"tcp://127.0.0.1:{server.dsl_port}", api_key=API_KEY)
    try:
        state = answer.run(backend=endpoint)
        by_default = answer.run(backend=endpoint, lora="sql")
        with pytest.raises(Exception, match="no LoRA adapter named 'nope'"):
            answer.run(backend=endpoint, lora="nope")
    finally:
        endpoint.close()
    assert state["under"] == completion(server, "sql")[3]
    assert by_default["under"] == state["under"]


def test_load_and_unload_while_serving(server: Server, adapters: dict[str, Any]) -> None:
    path = str(adapters["root"] / "poet")
    loaded = post(server, "/v1/load_lora_adapter", {"lora_name": "poet", "lora_path": path})
    assert loaded.status_code == 200 and loaded.json()["adapter"]["rank"] == 8, loaded.text
    ids, tokens, logprobs, _ = completion(server, "poet")
    assert_reference(ids, tokens, logprobs, adapters["refs"]["poet"], "poet")
    again = post(server, "/load_lora_adapter", {"lora_name": "poet", "lora_path": path})
    assert again.status_code == 400 and "loaded already" in again.text
    gone = post(server, "/unload_lora_adapter", {"lora_name": "poet"})
    assert gone.status_code == 200, gone.text
    with pytest.raises(ValueError, match="no LoRA adapter named 'poet'"):
        completion(server, "poet")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="not served here"):
        client.completions.create(model="poet", prompt=PROMPT, max_tokens=2)
    missing = post(server, "/v1/unload_lora_adapter", {"lora_name": "poet"})
    assert missing.status_code == 404 and "no LoRA adapter named 'poet'" in missing.text
    server.wait_idle()
    metrics = httpx.get(f"{server.url}/metrics", headers=server.headers(), timeout=30).text
    for adapter in ("poet", "sql", ""):
        assert re.search(rf'radixrt_lora_requests_total{{adapter="{adapter}"}} [1-9]', metrics)
    assert re.search(r'radixrt_lora_tokens_total{adapter="poet",kind="generated"} [1-9]',
                     metrics)


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"lora_name": "x", "lora_path": "/nonexistent"}, 400, "not a PEFT LoRA adapter folder"),
    ({"lora_name": "default", "lora_path": "/tmp"}, 400, "names the base model"),
    ({"lora_name": "x"}, 400, "lora_path"),
    ({"lora_name": "x" * 300, "lora_path": "/tmp"}, 400, "lora_name"),
])
def test_bad_loads_are_refused_and_serving_goes_on(server: Server, body: dict[str, Any],
                                                   status: int, message: str) -> None:
    response = post(server, "/load_lora_adapter", body)
    assert response.status_code == status and message in response.text, response.text
    assert completion(server, "sql")[1]


def test_an_adapter_of_another_model_is_refused(server: Server, tmp_path: Path,
                                                tokenizer: Any) -> None:
    from tiny_models import build_tiny

    base = build_tiny("llama-yarn", tmp_path / "tiny", tokenizer)
    make_adapter(base, tmp_path / "other", "attn-r4", 0)
    response = post(server, "/load_lora_adapter", {"lora_name": "other",
                                                   "lora_path": str(tmp_path / "other")})
    assert response.status_code == 400 and "do not fit" in response.text, response.text
