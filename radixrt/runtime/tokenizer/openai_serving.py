"""The handlers behind POST /v1/completions and POST /v1/chat/completions."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from radixrt.runtime.config import MODEL_ALIAS
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.http_streaming import (
    SSE_DONE,
    PrimedStream,
    PromptOutput,
    SSEResponse,
    collect_all,
    merge_streams,
    open_streams,
    sse,
    until_disconnected,
)
from radixrt.runtime.tokenizer.manager_base import TokenizerManager
from radixrt.runtime.tokenizer.openai_protocol import (
    APIError,
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatDelta,
    ChatMessageOut,
    ChatRequest,
    ChatResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    SamplingFields,
    TokenText,
    Usage,
    chat_logprobs,
    check_response_format,
    completion_logprobs,
    finish_reason_out,
    to_sampling_params,
)
from radixrt.runtime.tokenizer.prompts import Prompt


class OpenAIServing:
    def __init__(self, manager: TokenizerManager) -> None:
        self.manager = manager
        self.token_text = TokenText(manager.tokenizer)

    # --- shared steps ----------------------------------------------------------------------

    def check_model(self, model: str) -> None:
        if model not in (self.manager.model_name, MODEL_ALIAS):
            raise APIError(
                f"model {model!r} is not served here: use {self.manager.model_name!r} "
                f"(or {MODEL_ALIAS!r}); GET /v1/models lists it",
                param="model", code="model_not_found",
            )

    def encode(self, prompt: Prompt, param: str) -> list[int]:
        try:
            ids = self.manager.encode(prompt)
        except ValueError as exc:
            raise APIError(str(exc), param=param) from None
        limit = self.manager.context_length
        if len(ids) >= limit:
            raise APIError(
                f"the {param} has {len(ids)} tokens but the context length is {limit}: "
                f"shorten it to at most {limit - 1} tokens", param=param,
            )
        return ids

    def params_for(
        self, fields: SamplingFields, max_tokens: int | None, ids: list[int], top: int | None,
        logprobs: bool,
    ) -> SamplingParams:
        return to_sampling_params(
            fields, max_tokens, len(ids), self.manager.context_length,
            logprobs=logprobs, top_logprobs=top or 0,
        )

    async def open(
        self, request: Request, ids_list: list[list[int]], params_list: list[SamplingParams],
        rid: str,
    ) -> list[PrimedStream]:
        opening = open_streams(self.manager, ids_list, params_list, rid)
        return await until_disconnected(request, opening)

    async def collect(
        self, request: Request, streams: list[PrimedStream], ids_list: list[list[int]], n: int
    ) -> list[PromptOutput]:
        collecting = collect_all(streams, [len(ids) for ids in ids_list], n)
        return await until_disconnected(request, collecting)

    # --- /v1/completions -------------------------------------------------------------------

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self.check_model(body.model)
        check_response_format(body)
        if body.echo:
            raise APIError("echo is not supported: leave it out or set it to false", param="echo")
        ids_list = [self.encode(p, "prompt") for p in split_prompts(body.prompt)]
        top = body.logprobs
        params = [self.params_for(body, body.max_tokens, ids, top, top is not None)
                  for ids in ids_list]
        rid = f"cmpl-{uuid.uuid4().hex}"
        n = params[0].n
        streams = await self.open(request, ids_list, params, rid)
        if body.stream:
            return SSEResponse(self.stream_completions(body, streams, n, ids_list, rid))
        outputs = await self.collect(request, streams, ids_list, n)
        choices = []
        for i, out in enumerate(outputs):
            for j, sample in enumerate(out.samples):
                lp = None
                if top is not None:
                    lp = completion_logprobs(self.token_text, sample.logprobs)
                choices.append(CompletionChoice(
                    index=i * len(out.samples) + j, text=sample.text, logprobs=lp,
                    finish_reason=finish_reason_out(sample.finish_reason),
                ))
        response = CompletionResponse(
            id=rid, model=body.model, choices=choices, usage=usage_of(outputs)
        )
        return JSONResponse(response.model_dump())

    async def stream_completions(
        self, body: CompletionRequest, streams: list[PrimedStream], n: int,
        ids_list: list[list[int]], rid: str,
    ) -> AsyncGenerator[bytes, None]:
        tally = StreamTally([len(ids) for ids in ids_list])
        offsets: dict[int, int] = {}
        async for i, chunk in merge_streams(streams):
            tally.add(i, chunk)
            index = i * n + chunk.index
            lp = None
            if body.logprobs is not None:
                lp = completion_logprobs(self.token_text, chunk.logprobs, offsets.get(index, 0))
                offsets[index] = offsets.get(index, 0) + len(chunk.text)
            choice = CompletionChoice(
                index=index, text=chunk.text, logprobs=lp,
                finish_reason=finish_reason_out(chunk.finish_reason),
            )
            yield sse(CompletionResponse(id=rid, model=body.model, choices=[choice]).model_dump())
        if body.include_usage:
            final = CompletionResponse(id=rid, model=body.model, choices=[], usage=tally.usage())
            yield sse(final.model_dump())
        yield SSE_DONE

    # --- /v1/chat/completions --------------------------------------------------------------

    async def chat(self, body: ChatRequest, request: Request) -> Response:
        self.check_model(body.model)
        check_response_format(body)
        if not body.messages:
            raise APIError("messages is empty: send at least one message", param="messages")
        if body.top_logprobs and not body.logprobs:
            raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
        ids = self.encode([m.as_template_dict() for m in body.messages], "messages")
        max_tokens = body.max_completion_tokens
        if max_tokens is None:
            max_tokens = body.max_tokens
        params = self.params_for(body, max_tokens, ids, body.top_logprobs, body.logprobs)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await self.open(request, [ids], [params], rid)
        if body.stream:
            return SSEResponse(self.stream_chat(body, streams[0], len(ids), rid))
        out = (await self.collect(request, streams, [ids], params.n))[0]
        choices = [
            ChatChoice(
                index=j, message=ChatMessageOut(content=sample.text),
                logprobs=chat_logprobs(self.token_text, sample.logprobs) if body.logprobs else None,
                finish_reason=finish_reason_out(sample.finish_reason),
            )
            for j, sample in enumerate(out.samples)
        ]
        response = ChatResponse(id=rid, model=body.model, choices=choices, usage=usage_of([out]))
        return JSONResponse(response.model_dump())

    async def stream_chat(
        self, body: ChatRequest, stream: PrimedStream, prompt_tokens: int, rid: str
    ) -> AsyncGenerator[bytes, None]:
        tally = StreamTally([prompt_tokens])
        started: set[int] = set()
        async for _, chunk in merge_streams([stream]):
            tally.add(0, chunk)
            delta = ChatDelta(content=chunk.text)
            if chunk.index not in started:
                started.add(chunk.index)
                delta.role = "assistant"
            lp = chat_logprobs(self.token_text, chunk.logprobs) if body.logprobs else None
            choice = ChatChunkChoice(
                index=chunk.index, delta=delta, logprobs=lp,
                finish_reason=finish_reason_out(chunk.finish_reason),
            )
            yield sse(ChatChunk(id=rid, model=body.model, choices=[choice]).model_dump())
        if body.include_usage:
            yield sse(ChatChunk(id=rid, model=body.model, choices=[], usage=tally.usage())
                      .model_dump())
        yield SSE_DONE


# --- helpers -----------------------------------------------------------------------------------


def split_prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[Prompt]:
    """One prompt (a str or a list of token ids) or a batch of them."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError("prompt is empty: give text, token ids or a list of them", param="prompt")
    if isinstance(prompt[0], int):
        return [prompt]  # type: ignore[list-item]
    return list(prompt)  # type: ignore[arg-type]


def usage_of(outputs: Sequence[PromptOutput]) -> Usage:
    return Usage.of(
        prompt_tokens=sum(o.prompt_tokens for o in outputs),
        completion_tokens=sum(o.completion_tokens for o in outputs),
        cached_tokens=sum(o.cached_tokens for o in outputs),
    )


class StreamTally:
    """Token counts of a streamed request, for its final usage chunk."""

    def __init__(self, prompt_tokens: list[int]) -> None:
        self.prompt_tokens = prompt_tokens
        self.cached = [0] * len(prompt_tokens)
        self.completion_tokens = 0

    def add(self, prompt_index: int, chunk: StreamChunk) -> None:
        self.cached[prompt_index] = max(self.cached[prompt_index], chunk.cached_tokens)
        self.completion_tokens += len(chunk.token_ids)

    def usage(self) -> Usage:
        return Usage.of(sum(self.prompt_tokens), self.completion_tokens, sum(self.cached))


def model_card(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "radixrt"}
