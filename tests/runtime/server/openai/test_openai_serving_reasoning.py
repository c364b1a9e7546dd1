"""Reasoning models over the chat API, on the default model with chat templates the tests
control: a DeepSeek-R1-style template whose generation prompt opens the thinking (`<think>\n`),
and a Qwen 3-style one that closes it at once when `enable_thinking` is false
(chat_template_kwargs). A logit bias on "</" and ">" makes this small model close its thinking;
the thinking goes to reasoning_content, the answer to content, streamed or not; a JSON schema
applies only after the thinking; the next turn's prompt still hits the radix cache up to where
the template drops the earlier thinking."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from chat_templates import with_template
from http_serving import serve_in_thread

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
          "required": ["answer"]}
CLOSE_BIAS = {"9617": 6.0, "46": 6.0}  # "</" and ">": the model closes its thinking
SHUT_BIAS = {"9617": 8.0, "46": 8.0}  # ... at once
ASK = [{"role": "user", "content": "Is Paris in France? Think first."}]


@pytest.fixture(scope="module")
def clients(loaded_model: Any) -> Iterator[dict[str, openai.OpenAI]]:
    from radixrt import Engine
    from radixrt.runtime.server.http_server import create_app
    from radixrt.runtime.server.openai.chat_tool_plan import ChatFeatures

    engine = Engine(model=loaded_model, max_total_tokens=8192, check_integrity=True)
    r1 = engine.tokenizer_manager("smollm2")
    r1.tokenizer = with_template(r1.tokenizer, "{{ '<|im_start|>assistant\n<think>\n' }}")
    qwen = engine.tokenizer_manager("smollm2")
    qwen.tokenizer = with_template(qwen.tokenizer, (
        "{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and not "
        "enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"))
    ports, stop = serve_in_thread([
        create_app(r1, features=ChatFeatures.of(r1.tokenizer, reasoning_parser="deepseek-r1")),
        create_app(qwen, features=ChatFeatures.of(qwen.tokenizer, reasoning_parser="qwen3")),
    ])
    yield {name: openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0)
           for name, port in zip(["deepseek-r1", "qwen3"], ports)}
    stop()
    engine.check_integrity()


def ask(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("model", "default")
    kwargs.setdefault("messages", ASK)
    kwargs.setdefault("max_tokens", 60)
    return client.chat.completions.create(**kwargs)


def streamed(stream: Any) -> dict[int, tuple[str, str, str | None]]:
    """choice index -> (reasoning, content, finish_reason) from the deltas."""
    out: dict[int, list[Any]] = {}
    for chunk in stream:
        for choice in chunk.choices:
            item = out.setdefault(choice.index, ["", "", None])
            item[0] += getattr(choice.delta, "reasoning_content", None) or ""
            item[1] += choice.delta.content or ""
            item[2] = choice.finish_reason or item[2]
    return {i: (r, c, f) for i, (r, c, f) in out.items()}


def test_thinking_and_answer_separate_with_a_schema_after_the_thinking(
        clients: dict[str, openai.OpenAI]) -> None:
    kwargs = dict(n=6, seed=1, temperature=0.9, logit_bias=CLOSE_BIAS,
                  response_format={"type": "json_schema",
                                   "json_schema": {"name": "a", "schema": SCHEMA}})
    out = ask(clients["deepseek-r1"], **kwargs)
    done = [c for c in out.choices if c.finish_reason == "stop"]
    assert done, "the bias should close some thinking"
    for choice in done:
        message = choice.message
        jsonschema.validate(json.loads(message.content), SCHEMA)  # the answer alone
        assert message.reasoning_content is not None
        assert "<think>" not in message.reasoning_content
        assert "</think>" not in message.reasoning_content
    assert any(c.message.reasoning_content.strip() for c in done)  # some real thinking
    for choice in out.choices:
        if choice.finish_reason == "length":  # still thinking: everything is reasoning
            assert choice.message.content is None or choice.message.content == ""
    parts = streamed(ask(clients["deepseek-r1"], stream=True, **kwargs))
    for choice in out.choices:
        reasoning, content, reason = parts[choice.index]
        assert reasoning == (choice.message.reasoning_content or "")
        assert content == (choice.message.content or "")
        assert reason == choice.finish_reason


def test_without_a_constraint_the_split_is_the_parsers(clients: dict[str, openai.OpenAI]
                                                       ) -> None:
    """The thinking ends at the first closer; the answer is the rest, less the whitespace
    right after the closer. separate_reasoning=false (SGLang's switch) gives the raw text."""
    out = ask(clients["deepseek-r1"], temperature=0.0, logit_bias=SHUT_BIAS, max_tokens=24)
    message = out.choices[0].message
    whole = ask(clients["deepseek-r1"], temperature=0.0, logit_bias=SHUT_BIAS, max_tokens=24,
                extra_body={"separate_reasoning": False})
    raw = whole.choices[0].message.content
    assert whole.choices[0].message.reasoning_content is None
    assert message.reasoning_content is not None and "</think>" not in message.reasoning_content
    head = message.reasoning_content + "</think>"
    assert raw.startswith(head)
    assert raw[len(head):].lstrip() == (message.content or "")


def test_chat_template_kwargs_reach_the_template(clients: dict[str, openai.OpenAI]) -> None:
    """Qwen 3 style: enable_thinking=false renders an empty thinking in the prompt, so the
    output is all answer; with thinking on, an output without <think> is answer too."""
    off = ask(clients["qwen3"], temperature=0.0, max_tokens=8,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    on = ask(clients["qwen3"], temperature=0.0, max_tokens=8)
    assert off.usage.prompt_tokens > on.usage.prompt_tokens  # "<think>\n\n</think>\n\n"
    assert off.choices[0].message.reasoning_content is None
    assert off.choices[0].message.content


def test_the_next_turn_hits_the_cache_up_to_the_dropped_thinking(
        clients: dict[str, openai.OpenAI]) -> None:
    """The client sends the answer back, not the thinking: the template renders the earlier
    assistant turn without it, so the cache serves the conversation up to that turn (what the
    first prompt was, less its opened `<think>\n`), and the new turn is computed."""
    first = ask(clients["deepseek-r1"], temperature=0.0, logit_bias=CLOSE_BIAS, max_tokens=24)
    answer = first.choices[0].message.content or "yes"
    follow = [*ASK, {"role": "assistant", "content": answer},
              {"role": "user", "content": "And Rome?"}]
    second = ask(clients["deepseek-r1"], messages=follow, temperature=0.0, max_tokens=4)
    cached = second.usage.prompt_tokens_details.cached_tokens
    opened = 3  # "<think>\n" after the generation prompt: "<", "think", ">\n"
    assert cached >= first.usage.prompt_tokens - opened - 1
    assert cached < second.usage.prompt_tokens


def test_responses_and_messages_carry_the_thinking_apart(clients: dict[str, openai.OpenAI]
                                                         ) -> None:
    """The same split on the other chat surfaces: a Responses reasoning item (its text streamed
    as reasoning_text deltas) and an Anthropic thinking block hold the chat's reasoning_content,
    the message and the text block its content."""
    import anthropic

    chat = ask(clients["deepseek-r1"], temperature=0.0, max_tokens=24).choices[0].message
    client = clients["deepseek-r1"]
    resp = client.responses.create(model="default", input=ASK[0]["content"], temperature=0.0,
                                   max_output_tokens=24, store=False)
    reasoning = [i for i in resp.output if i.type == "reasoning"]
    assert len(reasoning) == 1 and reasoning[0].content[0].text == chat.reasoning_content
    assert resp.output_text == (chat.content or "")
    events = list(client.responses.create(model="default", input=ASK[0]["content"],
                                          temperature=0.0, max_output_tokens=24, store=False,
                                          stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == \
        chat.reasoning_content
    assert resp.usage.output_tokens_details.reasoning_tokens > 0
    claude = anthropic.Anthropic(base_url=str(client.base_url).removesuffix("/v1/"),
                                 api_key="x", max_retries=0)
    message = claude.messages.create(model="default", max_tokens=24, messages=ASK,
                                     extra_body={"temperature": 0.0})
    assert message.content[0].type == "thinking"
    assert message.content[0].thinking == chat.reasoning_content
    text = [b.text for b in message.content if b.type == "text"]
    assert "".join(text) == (chat.content or "")
