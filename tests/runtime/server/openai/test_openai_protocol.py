"""The OpenAI request and response shapes (no server): request bodies -> SamplingParams and
prompts, the validation errors with their messages and param names, the error body, and the
runtime's outputs -> finish reasons, error messages and usage (the logprob formats:
test_logprob_formats.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import ValidationError

from radixrt.runtime.config import MAX_TOP_LOGPROBS
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.core.error_shapes import APIError, error_body, error_message, param_of
from radixrt.runtime.server.openai.chat_tool_plan import template_messages
from radixrt.runtime.server.openai.openai_protocol import (
    ChatChunk,
    ChatChunkChoice,
    ChatDelta,
    ChatMessage,
    ChatRequest,
    ChatResponse,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
    build_sampling_params,
    constraint_fields,
    finish_reason_out,
    parse_logit_bias,
    to_sampling_params,
)

MODEL = "smollm2"


def completion(**body: Any) -> CompletionRequest:
    body.setdefault("model", MODEL)
    body.setdefault("prompt", "Hello")
    return CompletionRequest.model_validate(body)


def chat(**body: Any) -> ChatRequest:
    body.setdefault("model", MODEL)
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return ChatRequest.model_validate(body)


def params_of(fields: Any, max_tokens: int | None = 8, **kwargs: Any) -> SamplingParams:
    return to_sampling_params(fields, max_tokens, **kwargs)


# --- errors ------------------------------------------------------------------------------------


def test_api_error_and_error_body() -> None:
    err = APIError("top_p=0.0 is invalid", param="top_p")
    assert (err.status, err.type, err.code, str(err)) == (400, "invalid_request_error", None,
                                                          "top_p=0.0 is invalid")
    assert err.body() == {"error": {"message": "top_p=0.0 is invalid",
                                    "type": "invalid_request_error", "param": "top_p",
                                    "code": None}}
    other = APIError("model 'x' is not served here", status=404, param="model",
                     code="model_not_found", type="not_found_error")
    assert other.body()["error"] == {"message": "model 'x' is not served here",
                                     "type": "not_found_error", "param": "model",
                                     "code": "model_not_found"}
    assert error_body("boom") == {"error": {"message": "boom", "type": "invalid_request_error",
                                            "param": None, "code": None}}


@pytest.mark.parametrize(("message", "param"), [
    ("top_p=0.0 is invalid: must be in (0, 1]", "top_p"),
    ("logit_bias={5: 200.0} is invalid: value 200.0 ...", "logit_bias"),
    ("stop=['a=b'] is invalid", "stop"),
    ("give at most one of regex, json_schema, choices and tool_calls (got ['regex', 'x'])",
     None),
    ("json_schema is invalid: x=1", None),  # '=' only after the first words
    ("a.b=1 is invalid", None),
    ("no equals sign here", None),
    ("", None),
])
def test_param_of(message: str, param: str | None) -> None:
    assert param_of(message) == param


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -1.0), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 2.0),
    ("n", 0), ("frequency_penalty", 3.0), ("presence_penalty", -2.5),
    ("repetition_penalty", 0.0), ("min_tokens", 9), ("stop", ""), ("stop", ["ok", ""]),
])
def test_a_bad_value_is_a_400_naming_its_field(field: str, value: Any) -> None:
    """Both ways: the field the client sent -> SamplingParams' message -> the same param."""
    with pytest.raises(APIError) as info:
        params_of(completion(**{field: value}))
    err = info.value
    assert err.status == 400 and err.param == field
    assert err.message.startswith(f"{field}=") and "is invalid" in err.message


def test_max_tokens_zero_is_prefill_only_and_below_zero_refused() -> None:
    assert params_of(completion(), max_tokens=0).prefill_only  # echo's prompt scoring
    with pytest.raises(APIError, match=r"max_tokens=-1 is invalid: must be >= 1, 0") as info:
        params_of(completion(), max_tokens=-1)
    assert info.value.param == "max_tokens"


def test_build_sampling_params_turns_errors_into_api_errors() -> None:
    assert build_sampling_params({"max_tokens": 3}).max_tokens == 3
    with pytest.raises(APIError) as info:
        build_sampling_params({"max_tokens": 3, "bogus": 1})  # a TypeError: no field named
    assert info.value.param is None and "bogus" in info.value.message
    with pytest.raises(APIError) as info:
        build_sampling_params({"max_tokens": 3, "regex": "a", "choices": ["a"]})
    assert info.value.param is None and "at most one of regex" in info.value.message


# --- requests: parsing -------------------------------------------------------------------------


def test_unknown_fields_are_ignored_and_known_ones_type_checked() -> None:
    req = completion(foo=1, logprobs=2, stream_options={"include_usage": True})
    assert not hasattr(req, "foo") and req.logprobs == 2 and req.include_usage
    assert not completion().include_usage and not completion(stream=True).include_usage
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x"})  # model is required
    with pytest.raises(ValidationError, match="less than or equal to 20"):
        completion(logprobs=MAX_TOP_LOGPROBS + 1)
    with pytest.raises(ValidationError):
        chat(top_logprobs=-1)
    with pytest.raises(ValidationError):
        completion(seed=1.5)
    with pytest.raises(ValidationError):
        completion(response_format={"type": "xml"})


@pytest.mark.parametrize(("prompt", "kind"), [
    ("text", str), (["a", "b"], str), (["1", "2"], str), ([1, 2], int), ([[1], [2, 3]], list),
])
def test_prompt_shapes(prompt: Any, kind: type) -> None:
    req = completion(prompt=prompt)
    assert req.prompt == prompt
    first = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
    assert isinstance(first, kind)


def test_a_prompt_mixing_ids_and_text_is_refused() -> None:
    with pytest.raises(ValidationError):
        completion(prompt=[1, "a"])


def test_chat_messages_become_template_dicts() -> None:
    req = chat(messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello, "},
                                     {"type": "text", "text": "world"}]},
        {"role": "assistant", "content": "Hi", "name": "bot"},
    ])
    assert template_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello, world"},
        {"role": "assistant", "content": "Hi"},
    ]
    with pytest.raises(ValidationError):
        ChatMessage.model_validate({"role": "robot", "content": "x"})
    image = ChatMessage.model_validate({"role": "user", "content": [{"type": "image_url",
                                                                     "text": "x"}]})
    with pytest.raises(APIError, match="an image_url part needs"):
        image.text()
    with pytest.raises(APIError, match="'input_audio' is not supported"):
        ChatMessage(role="user", content=[{"type": "input_audio"}]).text()


def test_image_parts_reach_the_template_as_image_parts() -> None:
    """Text-only content stays one string; with images, the parts in order, each image a
    {"type": "image"} (where the template writes the image token)."""
    req = ChatRequest(model="m", messages=[
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": [
            {"type": "text", "text": "Look:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA==",
                                                "detail": "high"}},
            {"type": "image_url", "image_url": "http://x/y.png"}]},
    ])
    assert [m["content"] for m in template_messages(req)] == [
        "ab", [{"type": "text", "text": "Look:"}, {"type": "image"}, {"type": "image"}]]
    assert req.messages[1].images() == ["data:image/png;base64,AA==", "http://x/y.png"]
    assert req.messages[1].text() == "Look:" and req.messages[0].images() == []


def test_request_bodies_round_trip() -> None:
    body = {"model": MODEL, "prompt": [[1, 2], [3]], "max_tokens": 5, "temperature": 0.0,
            "stop": ["\n"], "logit_bias": {"5": 2.0}, "n": 2, "echo": True, "logprobs": 1}
    assert completion(**body).model_dump(exclude_unset=True) == body
    chat_body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                 "max_completion_tokens": 3, "logprobs": True, "top_logprobs": 2}
    assert chat(**chat_body).model_dump(exclude_unset=True) == chat_body


# --- requests -> SamplingParams ----------------------------------------------------------------


def test_fields_left_out_keep_the_sampling_defaults() -> None:
    params = params_of(completion(), max_tokens=8)
    defaults = SamplingParams(max_tokens=8)
    assert params == defaults


def test_every_passed_through_field_arrives() -> None:
    fields = completion(temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, n=3, seed=11,
                        frequency_penalty=0.5, presence_penalty=-0.5, repetition_penalty=1.1,
                        ignore_eos=True, min_tokens=2, stop="END", logit_bias={"5": 2, "7": -1})
    params = params_of(fields, max_tokens=9, logprobs=True, top_logprobs=3,
                       prompt_logprobs_start=1)
    assert params == SamplingParams(
        max_tokens=9, temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, n=3, seed=11,
        frequency_penalty=0.5, presence_penalty=-0.5, repetition_penalty=1.1, ignore_eos=True,
        min_tokens=2, stop=("END",), logit_bias={5: 2.0, 7: -1.0}, logprobs=True,
        top_logprobs=3, prompt_logprobs_start=1)
    assert params_of(completion(stop=["a", "b"])).stop == ("a", "b")
    assert params_of(completion(temperature=0)).is_greedy


def test_max_tokens_left_out_is_left_to_the_runtime_rule() -> None:
    """The OpenAI layer passes None on: the one default rule applies where the request is
    queued (SamplingParams.resolved_max_tokens), as for the Engine and the DSL."""
    fields = completion()
    assert to_sampling_params(fields, None).max_tokens is None
    assert to_sampling_params(fields, None).resolved_max_tokens(10, 100) == 90
    assert to_sampling_params(fields, 7).max_tokens == 7  # given: kept


def test_logit_bias_keys_must_be_token_ids() -> None:
    assert parse_logit_bias(None) is None
    assert parse_logit_bias({"5": 1.5, "0": -100}) == {5: 1.5, 0: -100}
    with pytest.raises(APIError, match=r"logit_bias key 'x' must be a token id") as info:
        parse_logit_bias({"5": 1.0, "x": 2.0})
    assert info.value.param == "logit_bias"
    with pytest.raises(APIError, match=r"key -1 must be a token id") as info:
        params_of(completion(logit_bias={"-1": 1}))
    assert info.value.param == "logit_bias"
    with pytest.raises(APIError, match=r"value 200.0 for token 5") as info:
        params_of(completion(logit_bias={"5": 200}))
    assert info.value.param == "logit_bias"
    assert params_of(completion(logit_bias={})).logit_bias is None


def test_constraints_and_response_format() -> None:
    assert constraint_fields(completion()) == {}
    assert constraint_fields(completion(regex="[0-9]+")) == {"regex": "[0-9]+"}
    assert constraint_fields(completion(choices=["a", "b"])) == {"choices": ["a", "b"]}
    assert constraint_fields(completion(json_schema={"type": "integer"})) == {
        "json_schema": {"type": "integer"}}
    assert constraint_fields(completion(response_format={"type": "text"})) == {}
    assert constraint_fields(completion(response_format={"type": "text"}, regex="a")) == {
        "regex": "a"}
    assert constraint_fields(completion(response_format={"type": "json_object"})) == {
        "json_schema": {"type": "object"}}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}
    assert constraint_fields(completion(response_format=fmt)) == {"json_schema": schema}
    params = params_of(completion(response_format=fmt))
    assert params.constraint is not None and params.constraint[0] == "json_schema"
    assert SamplingParams(json_schema=params.json_schema).json_schema == params.json_schema
    assert params_of(completion(choices=["x", "y"])).constraint == ("choices", ("x", "y"))


@pytest.mark.parametrize(("body", "message"), [
    ({"response_format": {"type": "json_object"}, "regex": "a"},
     "response_format and ['regex'] both constrain the output: give one"),
    ({"response_format": {"type": "json_object"}, "choices": ["a"], "json_schema": {}},
     "response_format and ['choices', 'json_schema'] both constrain the output"),
    ({"response_format": {"type": "json_schema"}}, "response_format of type json_schema needs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format of type json_schema needs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "{}"}}},
     "response_format of type json_schema needs"),
])
def test_response_format_errors_name_it(body: dict[str, Any], message: str) -> None:
    with pytest.raises(APIError) as info:
        params_of(completion(**body))
    assert info.value.param == "response_format" and info.value.message.startswith(message)


def test_constraint_conflicts_reach_sampling_params_checks() -> None:
    with pytest.raises(APIError, match="give at most one of regex, json_schema, choices"):
        params_of(completion(regex="a", choices=["a"]))
    with pytest.raises(APIError, match="cannot be combined with regex") as info:
        params_of(completion(regex="a", ignore_eos=True))
    assert info.value.param == "ignore_eos"
    with pytest.raises(APIError, match="must be 0 with choices") as info:
        params_of(completion(choices=["a"], min_tokens=1))
    assert info.value.param == "min_tokens"


def test_chat_fields_map_like_completions() -> None:
    req = chat(temperature=0.2, stop=["\n"], n=2, seed=1, logprobs=True, top_logprobs=4)
    params = params_of(req, max_tokens=5, logprobs=req.logprobs, top_logprobs=req.top_logprobs)
    assert (params.temperature, params.stop, params.n, params.seed) == (0.2, ("\n",), 2, 1)
    assert params.logprobs and params.top_logprobs == 4 and params.max_tokens == 5


# --- runtime outputs -> responses --------------------------------------------------------------


@pytest.mark.parametrize(("reason", "out", "message"), [
    (None, None, None),
    ("stop", "stop", None),
    ("length", "length", None),
    ("abort", "abort", None),
    ("error: the KV pool is too small for this request", "error",
     "the KV pool is too small for this request"),
    ("error: the grammar failed to compile: x: y", "error", "the grammar failed to compile: x: y"),
])
def test_finish_reasons_and_error_messages(reason: str | None, out: str | None,
                                           message: str | None) -> None:
    assert finish_reason_out(reason) == out
    assert error_message(reason) == message


def test_usage() -> None:
    usage = Usage.of(prompt_tokens=7, completion_tokens=5, cached_tokens=4)
    assert usage.model_dump() == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
                                  "prompt_tokens_details": {"cached_tokens": 4}}


def test_response_models_have_their_object_names_and_round_trip() -> None:
    before = int(time.time())
    usage = Usage.of(3, 2, 0)
    resp = CompletionResponse(id="cmpl-1", model=MODEL, usage=usage, choices=[
        CompletionChoice(index=0, text="hi", finish_reason="stop",
                         logprobs=CompletionLogprobs(tokens=["hi"], token_logprobs=[-0.1],
                                                     top_logprobs=[{"hi": -0.1}],
                                                     text_offset=[0]))])
    dumped = resp.model_dump()
    assert dumped["object"] == "text_completion" and before <= dumped["created"] <= time.time()
    assert CompletionResponse.model_validate(dumped) == resp
    chat_resp = ChatResponse.model_validate({
        "id": "chatcmpl-1", "model": MODEL,
        "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "length"}]})
    assert chat_resp.object == "chat.completion" and chat_resp.choices[0].message.role == \
        "assistant"
    assert ChatResponse.model_validate(chat_resp.model_dump()) == chat_resp
    chunk = ChatChunk(id="chatcmpl-1", model=MODEL, choices=[
        ChatChunkChoice(index=1, delta=ChatDelta(role="assistant", content="h"))])
    assert chunk.object == "chat.completion.chunk" and chunk.usage is None
    assert ChatChunk.model_validate(chunk.model_dump()) == chunk


def test_tool_choice_none_adds_a_grammar_only_where_the_format_has_an_opener() -> None:
    """Hermes: none keeps <tool_call> out with a grammar; Llama-3 JSON calls have no opener and
    the output of none is not parsed, so nothing constrains it."""
    from radixrt.runtime.constrained.structural import TOOL_FORMATS
    from radixrt.runtime.server.openai.chat_tool_plan import ChatFeatures, plan_chat

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = chat(tools=tools, tool_choice="none")
    hermes = plan_chat(body, ChatFeatures(TOOL_FORMATS["hermes"]), {})
    llama = plan_chat(body, ChatFeatures(TOOL_FORMATS["llama3_json"]), {})
    assert set(hermes.constraint) == {"tool_calls"} and not hermes.parse_calls
    assert llama.constraint == {} and not llama.parse_calls
    schema = {"json_schema": {"type": "object"}}
    assert plan_chat(body, ChatFeatures(TOOL_FORMATS["hermes"]), schema).constraint == schema
