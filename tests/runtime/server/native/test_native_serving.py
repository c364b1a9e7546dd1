"""The native API speaks SGLang's /generate protocol (batches, SGLang's sampling names,
prefill-only, logprobs in meta_info as SGLang shapes them, text-so-far streams, finish_reason
objects, client rids, /abort_request, /get_model_info, /get_server_info) and serves
/concate_and_append_request exactly: a real model behind a real socket, checked against the
Engine and the OpenAI endpoint."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from http_serving import serve_in_thread, sse_events, wait_idle

MODEL = "default"
PROMPT = "The capital of France is"
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
TOL = 1e-5


class Native:
    def __init__(self, engine: Any, port: int) -> None:
        self.engine = engine
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def generate(self, **body: Any) -> Any:
        response = self.http.post("/generate", json=body)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture(scope="module")
def native(loaded_model: Any) -> Iterator[Native]:
    from radixrt import Engine
    from radixrt.runtime.server.http_server import create_app

    engine = Engine(model=loaded_model, max_total_tokens=4096, check_integrity=True)
    ports, stop = serve_in_thread([create_app(engine.tokenizer_manager("smollm2"))])
    srv = Native(engine, ports[0])
    yield srv
    srv.http.close()
    stop()
    engine.check_integrity()


def test_one_prompt_answers_an_object_with_sglang_meta_info(native: Native) -> None:
    out = native.generate(text=PROMPT, sampling_params=GREEDY, rid="my-request")
    meta = out["meta_info"]
    assert meta["id"] == "my-request"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["completion_tokens"] == len(out["output_ids"]) == 6
    assert meta["prompt_tokens"] == len(native.engine.tokenizer.encode(PROMPT))
    expect = native.engine.generate(PROMPT, _params(max_tokens=6, ignore_eos=True))[0]
    assert out["output_ids"] == expect.token_ids and out["text"] == expect.text


def test_a_batch_is_a_list_in_prompt_order_with_per_prompt_params(native: Native) -> None:
    prompts = [PROMPT, "One, two, three,", "The sky is"]
    params = [dict(GREEDY, max_new_tokens=n) for n in (2, 4, 3)]
    outs = native.generate(text=prompts, sampling_params=params, rid=["a", "b", "c"])
    assert [o["meta_info"]["id"] for o in outs] == ["a", "b", "c"]
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [2, 4, 3]
    for prompt, sp, out in zip(prompts, params, outs):
        alone = native.generate(text=prompt, sampling_params=sp)
        assert out["output_ids"] == alone["output_ids"]
    ids = [native.engine.tokenizer.encode(p) for p in prompts[:2]]
    by_ids = native.generate(input_ids=ids, sampling_params=GREEDY)
    assert [o["output_ids"] for o in by_ids] == [
        native.generate(input_ids=i, sampling_params=GREEDY)["output_ids"] for i in ids]
    single_in_list = native.generate(text=[PROMPT], sampling_params=GREEDY)
    assert isinstance(single_in_list, list) and len(single_in_list) == 1
    n2 = native.generate(text=prompts[:2], sampling_params={"max_new_tokens": 3, "n": 2,
                                                            "sampling_seed": 5})
    assert len(n2) == 4  # prompt-major: a's two samples, then b's


def test_sglang_sampling_names(native: Native) -> None:
    short = native.generate(text=PROMPT, sampling_params={
        "temperature": 0, "max_new_tokens": 40, "stop_token_ids": [], "min_new_tokens": 12})
    assert short["meta_info"]["completion_tokens"] >= 12
    seeded = [native.generate(text=PROMPT, sampling_params={
        "temperature": 1.0, "max_new_tokens": 8, "sampling_seed": 11})["output_ids"]
        for _ in range(2)]
    assert seeded[0] == seeded[1]
    # radixrt's own names stay aliases; both at once is a mistake
    same = native.generate(text=PROMPT, sampling_params={"temperature": 0, "max_tokens": 6,
                                                         "ignore_eos": True})
    assert same["output_ids"] == native.generate(text=PROMPT, sampling_params=GREEDY)["output_ids"]
    both = native.http.post("/generate", json={"text": PROMPT, "sampling_params": {
        "max_tokens": 2, "max_new_tokens": 2}})
    assert both.status_code == 400 and "twice" in both.json()["error"]["message"]


def test_max_new_tokens_zero_is_a_prefill_only_request_that_caches_the_prompt(
        native: Native) -> None:
    native.http.post("/flush_cache")
    text = " ".join(f"Item {i} is a prefix to cache." for i in range(12))
    out = native.generate(text=text, sampling_params={"max_new_tokens": 0})
    meta = out["meta_info"]
    assert out["text"] == "" and out["output_ids"] == [] and meta["completion_tokens"] == 0
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    again = native.generate(text=text + " And then", sampling_params={"max_new_tokens": 1})
    assert again["meta_info"]["cached_tokens"] >= meta["prompt_tokens"] - 1
    wait_idle(native)  # type: ignore[arg-type]


def test_logprobs_match_the_openai_endpoint_and_the_engine(native: Native) -> None:
    """return_logprob / logprob_start_len / top_logprobs_num / return_text_in_logprobs fill
    meta_info as SGLang does; the numbers equal /v1/completions' (echo) and the Engine's."""
    ids = native.engine.tokenizer.encode(PROMPT)
    start = 2
    out = native.generate(text=PROMPT, sampling_params=GREEDY, return_logprob=True,
                          logprob_start_len=start, top_logprobs_num=3,
                          return_text_in_logprobs=True)
    meta = out["meta_info"]
    inputs, outputs = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert [e[1] for e in inputs] == ids[start:]
    assert inputs[0][0] is None  # nothing before it is computed: SGLang's null
    assert [e[1] for e in outputs] == out["output_ids"]
    assert meta["output_token_logprobs_length"] == 6
    tok = native.engine.tokenizer
    assert [e[2] for e in outputs] == [tok.decode([t]) for t in out["output_ids"]]
    assert len(meta["output_top_logprobs"]) == 6 and all(len(t) == 3
                                                         for t in meta["output_top_logprobs"])
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"]) == len(inputs)
    assert meta["output_top_logprobs"][0][0][1] == out["output_ids"][0]  # greedy: the top one

    engine = native.engine.generate(PROMPT, _params(max_tokens=6, ignore_eos=True, logprobs=True,
                                                    top_logprobs=3,
                                                    prompt_logprobs_start=start + 1))[0]
    assert [e[0] for e in outputs] == pytest.approx([lp.logprob for lp in engine.logprobs],
                                                    abs=TOL)
    assert [e[0] for e in inputs[1:]] == pytest.approx(
        [lp.logprob for lp in engine.prompt_logprobs], abs=TOL)
    openai = native.http.post("/v1/completions", json={
        "model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
        "logprobs": 3, "echo": True}).json()["choices"][0]["logprobs"]
    echoed = openai["token_logprobs"]  # the prompt's (first: null), then the output's
    assert [e[0] for e in inputs[1:]] == pytest.approx(echoed[start + 1:len(ids)], abs=TOL)
    assert [e[0] for e in outputs] == pytest.approx(echoed[len(ids):], abs=TOL)
    plain = native.generate(text=PROMPT, sampling_params=GREEDY, return_logprob=True)
    assert plain["meta_info"]["input_token_logprobs"] == []  # logprob_start_len -1: none
    assert plain["meta_info"]["output_token_logprobs"][0][2] is None  # no text asked for


def test_a_stream_carries_everything_so_far(native: Native) -> None:
    # 32 tokens: with speculative decoding a step may bring up to 8, so the stream has several
    body = {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 32}, "stream": True,
            "return_logprob": True, "rid": "streamed"}
    whole = native.generate(**{**body, "stream": False})
    with native.http.stream("POST", "/generate", json=body) as response:
        events = [e for e in sse_events(response) if e != "[DONE]"]
    assert len(events) >= 2
    for event in events:
        meta = event["meta_info"]
        assert meta["id"] == "streamed" and whole["text"].startswith(event["text"])
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] == len(
            event["output_ids"])
    assert events[-1]["text"] == whole["text"] and events[-1]["output_ids"] == whole["output_ids"]
    last = events[-1]["meta_info"]
    assert last["finish_reason"] == whole["meta_info"]["finish_reason"]
    # within 1e-4: a drafted token's logprob comes from the extend path, a decoded one's from
    # the decode path (speculative decoding drafts the stream's tokens from `whole`'s answer)
    assert [e[0] for e in last["output_token_logprobs"]] == pytest.approx(
        [e[0] for e in whole["meta_info"]["output_token_logprobs"]], abs=1e-4)


def test_finish_reason_names_what_matched(native: Native) -> None:
    free = native.generate(text=PROMPT, sampling_params=GREEDY)
    stop_id = free["output_ids"][2]
    by_id = native.generate(text=PROMPT, sampling_params={
        "temperature": 0, "max_new_tokens": 6, "stop_token_ids": [stop_id]})
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    word = native.engine.tokenizer.decode(free["output_ids"][:3]).split()[-1]
    by_text = native.generate(text=PROMPT, sampling_params={
        "temperature": 0, "max_new_tokens": 6, "stop": [word]})
    assert by_text["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}


def test_model_and_server_info_under_sglang_names(native: Native) -> None:
    model = native.http.get("/get_model_info").json()
    assert model == native.http.get("/model_info").json() and model["is_generation"] is True
    info = native.http.get("/get_server_info").json()
    assert "registered_sequences" in info and info.keys() == native.http.get(
        "/server_info").json().keys()


def test_abort_request_by_the_client_rid_and_all(native: Native) -> None:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
            "stream": True, "rid": "to-abort"}
    with native.http.stream("POST", "/generate", json=body) as response:
        events = sse_events(response)
        next(events)
        answer = httpx.post(native.url + "/abort_request", json={"rid": "to-abort"}).json()
        assert answer["aborted"] == 1
        rest = [e for e in events if e != "[DONE]"]
    assert rest[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    done: list[Any] = []

    def long_request() -> None:
        done.append(native.http.post("/generate", json={
            "text": PROMPT, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}))

    worker = threading.Thread(target=long_request)
    worker.start()
    while native.http.get("/server_info").json()["running"] == 0:
        pass
    assert httpx.post(native.url + "/abort_request", json={"abort_all": True}).json()[
        "aborted"] >= 1
    worker.join(timeout=60)
    assert done and done[0].status_code == 200
    assert done[0].json()["meta_info"]["completion_tokens"] < 2000
    neither = httpx.post(native.url + "/abort_request", json={})
    assert neither.status_code == 400
    wait_idle(native)  # type: ignore[arg-type]


@pytest.mark.parametrize(("body", "expect"), [
    ({"text": PROMPT, "image_data": "a.png"}, "takes no images"),  # a text model
    ({"text": PROMPT, "lora_path": "adapter"}, "lora_path"),
    ({"text": PROMPT, "session_id": "s"}, "session_id"),
    ({"text": PROMPT, "sampling_params": {"stop_regex": "x"}}, "stop_regex"),
    ({"text": PROMPT, "sampling_params": {"spaces_between_special_tokens": False}},
     "spaces_between_special_tokens"),
    ({"text": PROMPT, "sampling_params": {"ebnf": "root ::= ("}}, "ebnf is invalid"),
    ({"text": PROMPT, "sampling_params": {"max_new_tokenz": 3}}, "unknown sampling_params"),
    ({"text": PROMPT, "return_hidden_states": True}, "return_hidden_states"),
    ({"text": PROMPT, "something_new": 1}, "something_new"),
    ({"text": PROMPT, "top_logprobs_num": 2}, "needs return_logprob"),
    ({"text": PROMPT, "logprob_start_len": 0}, "needs return_logprob"),
    ({"text": PROMPT, "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
    ({"text": [PROMPT, PROMPT], "rid": "one"}, "rid"),
    ({"text": [PROMPT, PROMPT], "sampling_params": [{}]}, "2 prompts"),
    ({"text": PROMPT, "sampling_params": [{}]}, "one prompt"),
    ({"text": []}, "empty batch"),
    ({"text": [PROMPT] * 129}, "at most 128"),
    ({"text": PROMPT, "rid": "x" * 129}, "rid"),
])
def test_what_radixrt_does_not_serve_is_a_400_naming_it(native: Native, body: dict[str, Any],
                                                         expect: str) -> None:
    response = native.http.post("/generate", json=body)
    assert response.status_code == 400, response.text
    assert expect in response.text


def test_the_off_values_sglang_clients_send_are_accepted(native: Native) -> None:
    """What SGLang's RuntimeEndpoint and bench_serving send when they use none of it."""
    out = native.generate(text=PROMPT, lora_path=None, return_logprob=False, logprob_start_len=-1,
                          return_routed_experts=False, session_id=None, image_data=None,
                          sampling_params={**GREEDY, "skip_special_tokens": True,
                                           "spaces_between_special_tokens": True,
                                           "stop_regex": None, "top_k": None})
    assert out["meta_info"]["completion_tokens"] == 6


def test_concate_and_append_is_exact(native: Native) -> None:
    """The destination gets each source's tokens past it appended, prefilled as one sequence:
    the tree's part read, the rest computed at its true positions. Generating on the joined
    sequence then equals generating on it from scratch."""
    tok = native.engine.tokenizer
    base = "USER: I will ask a question based on some statements.\n"
    forks = ["Statement 0: Ethan is the father of Liam.\n",
             "Statement 1: Noah is the father of Julian.\n"]
    prefill = {"max_new_tokens": 0}
    native.generate(text=base, sampling_params=prefill, rid="dst")
    for i, fork in enumerate(forks):
        native.generate(text=base + fork, sampling_params=prefill, rid=f"src{i}")
    joined = tok.encode(base)
    for fork in forks:
        joined += tok.encode(base + fork)[len(tok.encode(base)):]
    answer = native.http.post("/concate_and_append_request",
                              json={"src_rids": ["src0", "src1"], "dst_rid": "dst"})
    assert answer.status_code == 200, answer.text
    appended = answer.json()
    assert appended["prompt_tokens"] == len(joined)
    assert appended["cached_tokens"] >= len(tok.encode(base + forks[0])) - 1  # dst + first fork
    question = tok.encode("Who is the father of Julian?")
    after = native.generate(input_ids=joined + question, sampling_params=GREEDY,
                            return_logprob=True)
    assert after["meta_info"]["cached_tokens"] >= len(joined) - 1
    native.http.post("/flush_cache")
    fresh = native.generate(input_ids=joined + question, sampling_params=GREEDY,
                            return_logprob=True)
    assert fresh["meta_info"]["cached_tokens"] == 0
    assert after["output_ids"] == fresh["output_ids"]
    assert [e[0] for e in after["meta_info"]["output_token_logprobs"]] == pytest.approx(
        [e[0] for e in fresh["meta_info"]["output_token_logprobs"]], abs=1e-4)
    # the destination is now the joined sequence: it can be the destination of a next join
    native.generate(input_ids=joined + question, sampling_params=prefill, rid="src2")
    again = native.http.post("/concate_and_append_request",
                             json={"src_rids": ["src2"], "dst_rid": "dst"}).json()
    assert again["prompt_tokens"] == len(joined) + len(question)


def test_concate_and_append_refuses_what_it_cannot_serve(native: Native) -> None:
    native.generate(text="Alpha beta", sampling_params={"max_new_tokens": 0}, rid="d")
    native.generate(text="Gamma delta", sampling_params={"max_new_tokens": 0}, rid="s")
    unknown = native.http.post("/concate_and_append_request",
                               json={"src_rids": ["never-seen"], "dst_rid": "d"})
    assert unknown.status_code == 404 and "never-seen" in unknown.text
    other = native.http.post("/concate_and_append_request",
                             json={"src_rids": ["s"], "dst_rid": "d"})
    assert other.status_code == 400 and "does not continue" in other.text
    salted = native.http.post("/concate_and_append_request",  # another namespace sees nothing
                              json={"src_rids": ["s"], "dst_rid": "d", "cache_salt": "other"})
    assert salted.status_code == 404


def _params(**values: Any) -> Any:
    from radixrt import SamplingParams

    return SamplingParams(temperature=0, **values)
