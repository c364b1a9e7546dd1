"""The handlers behind OpenAI's Responses API: POST /v1/responses (streamed or not),
GET /v1/responses/{id}, DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel.

A request becomes the one chat request (responses_protocol.to_chat_request, after the stored
conversation of previous_response_id) and takes the chat path (OpenAIServing.prepare_chat:
template, tool grammar, reasoning, limits, tenants) and the same runtime streams; the output is
written as output items and, streamed, as the Responses API's event sequence. With store (the
default) the response, its conversation and a pin of that conversation's KV are kept in the
ResponseStore (response_store.py), scoped to the API key's tenant.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.server.core.error_shapes import APIError, error_message, translated
from radixrt.runtime.server.core.http_streaming import (
    PrimedStream,
    SSEResponse,
    merge_streams,
    named_sse,
)
from radixrt.runtime.server.core.tenants import tenant_of
from radixrt.runtime.server.openai.chat_output import (
    ChoiceParser,
    ChoicePiece,
    Segment,
    SegmentTracker,
    new_id,
)
from radixrt.runtime.server.openai.chat_tool_plan import ChatToolPlan
from radixrt.runtime.server.openai.logprob_formats import chat_logprobs
from radixrt.runtime.server.openai.openai_protocol import ChatMessage
from radixrt.runtime.server.openai.openai_serving import OpenAIServing
from radixrt.runtime.server.openai.tool_protocol import FunctionCallIn, ToolCallIn
from radixrt.runtime.server.responses.response_store import ResponseStore
from radixrt.runtime.server.responses.responses_protocol import (
    DeletedResponse,
    IncompleteDetails,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)


@dataclass
class Turn:
    """One create call while it runs: what it needs at the end to answer and to store."""

    tenant: str
    body: ResponsesRequest
    earlier: list[ChatMessage]
    response: ResponseObject
    prompt_tokens: int


class ResponsesServing:
    def __init__(self, chat: OpenAIServing, store: ResponseStore) -> None:
        self.chat = chat
        self.store = store
        self.running: dict[tuple[str, str], ResponseObject] = {}  # in progress, for cancel

    # --- create --------------------------------------------------------------------------

    async def create(self, body: ResponsesRequest, request: Request) -> Response:
        tenant = tenant_of(request, None)  # the API key's name: stored responses are its own
        earlier: list[ChatMessage] = []
        if body.previous_response_id is not None:
            previous = self.store.get(tenant, body.previous_response_id)
            if previous is None:
                raise APIError(f"previous_response_id {body.previous_response_id!r}: no stored "
                               "response has this id (it was never stored, was deleted or "
                               "expired): send the whole conversation as input",
                               param="previous_response_id", status=404, code="not_found")
            earlier = previous.conversation
        chat = translated(lambda: body.to_chat_request(earlier))
        prepared = await self.chat.prepare_chat(chat)
        plan, ids, params = prepared.parts()
        rid = new_id("resp")
        turn = Turn(tenant, body, earlier, ResponseObject.start(rid, body), len(ids))
        pin = body.store and self.store.pins is not None
        streams = await self.chat.open(request, chat, [ids], [params], rid, pin=pin,
                                       images=[prepared.images])
        if body.stream:
            return SSEResponse(self.stream(turn, plan, streams[0]))
        # (not cancellable: its client learns its id only from the answer)
        out = (await self.chat.collect(request, streams, [ids], 1))[0]
        sample = out.samples[0]
        parser = self.chat.choice_parser(plan)
        parser.feed(sample.text)
        parser.finish()
        items = self.items_of(parser, sample.finish_reason)
        pin_id = streams[0].rid if out.pinned else None
        self.finish(turn, items, sample.finish_reason, out.completion_tokens,
                    out.cached_tokens, sample.logprobs)
        await self.keep(turn, pin_id)
        return JSONResponse(turn.response.model_dump())

    def items_of(self, parser: ChoiceParser, finish_reason: str | None) -> list[OutputItem]:
        """A whole output's items: its reasoning, its text, its calls."""
        message = parser.message()
        status = "incomplete" if finish_reason == "length" else "completed"
        items: list[OutputItem] = []
        if message.reasoning_content:
            items.append(OutputReasoning(id=new_id("rs"), content=[
                ReasoningText(text=message.reasoning_content)], status=status))
        if message.content or not message.tool_calls:
            items.append(OutputMessage(id=new_id("msg"), status=status,
                                       content=[OutputText(text=message.content or "")]))
        for call in message.tool_calls or ():
            items.append(OutputFunctionCall(id=new_id("fc"), call_id=call.id,
                                            name=call.function.name,
                                            arguments=call.function.arguments, status=status))
        return items

    def finish(self, turn: Turn, items: list[OutputItem], finish_reason: str | None,
               output_tokens: int, cached_tokens: int, logprobs: list[TokenLogprob]) -> None:
        """The response once its output is whole (streamed or not): items, status, usage, and
        with top_logprobs the logprobs of its text."""
        response = turn.response
        response.output = items
        if turn.body.top_logprobs is not None:
            for item in items:
                if isinstance(item, OutputMessage):
                    item.content[0].logprobs = chat_logprobs(self.chat.token_text,
                                                             logprobs).content
        response.status = {"length": "incomplete", "abort": "cancelled"}.get(
            finish_reason or "", "completed")
        if finish_reason == "length":
            response.incomplete_details = IncompleteDetails(reason="max_output_tokens")
        reasoning = "".join(c.text for item in items if isinstance(item, OutputReasoning)
                            for c in item.content)
        reasoning_tokens = len(self.chat.manager.tokenizer.encode(
            reasoning, add_special_tokens=False)) if reasoning else 0
        response.usage = ResponseUsage.of(turn.prompt_tokens, output_tokens, cached_tokens,
                                          reasoning_tokens)

    async def keep(self, turn: Turn, pin_id: int | None) -> None:
        """Store the response with its conversation (store=true), which takes over the pin of
        the response it continued; without store, release the pin."""
        if not turn.body.store:
            return
        conversation = [*turn.earlier, *turn.body.input_messages(),
                        *output_messages(turn.response.output)]
        stored = await self.store.put(turn.tenant, turn.response.id,
                                      turn.response.model_dump(), conversation, pin_id)
        previous = turn.body.previous_response_id
        if stored is not None and stored.pin_id is not None and previous is not None:
            await self.store.take_pin(turn.tenant, previous)

    # --- stream --------------------------------------------------------------------------

    async def stream(self, turn: Turn, plan: ChatToolPlan, stream: PrimedStream
                     ) -> AsyncGenerator[bytes, None]:
        """response.created, response.in_progress, the items' events (output_item.added,
        content_part.added, output_text.delta / function_call_arguments.delta /
        reasoning_text.delta, their .done, output_item.done), then response.completed (or
        .incomplete); a failure mid-stream is response.failed."""
        key = (turn.tenant, turn.response.id)
        self.running[key] = turn.response
        parser = self.chat.choice_parser(plan)
        writer = ItemWriter()
        output_tokens = cached = 0
        logprobs: list[TokenLogprob] = []
        pin_id: int | None = None
        try:
            yield writer.event("response.created", response=turn.response.model_dump())
            yield writer.event("response.in_progress", response=turn.response.model_dump())
            last: StreamChunk | None = None
            async for _, chunk in merge_streams([stream]):
                last = chunk
                output_tokens += len(chunk.token_ids)
                cached = max(cached, chunk.cached_tokens)
                logprobs += chunk.logprobs
                failure = error_message(chunk.finish_reason)
                if failure is not None:
                    turn.response.status = "failed"
                    turn.response.error = {"code": "server_error", "message": failure}
                    yield writer.event("response.failed", response=turn.response.model_dump())
                    return
                for item in writer.write(parser.feed(chunk.text)):
                    yield item
                if chunk.finish_reason is not None:
                    pin_id = chunk.rid if chunk.pinned else None
                    status = "incomplete" if chunk.finish_reason == "length" else "completed"
                    for item in writer.write(parser.finish()) + writer.close(status):
                        yield item
            reason = last.finish_reason if last is not None else None
            self.finish(turn, writer.items, reason, output_tokens, cached, logprobs)
            await self.keep(turn, pin_id)
            done = {"completed": "response.completed", "incomplete": "response.incomplete"}
            yield writer.event(done.get(turn.response.status, "response.completed"),
                               response=turn.response.model_dump())
        finally:
            self.running.pop(key, None)

    # --- retrieve, delete, cancel ----------------------------------------------------------

    def get(self, rid: str, request: Request) -> Response:
        tenant = tenant_of(request, None)
        running = self.running.get((tenant, rid))
        if running is not None:
            return JSONResponse(running.model_dump())
        stored = self.store.get(tenant, rid)
        if stored is None:
            raise not_found(rid)
        return JSONResponse(stored.response)

    async def delete(self, rid: str, request: Request) -> Response:
        if not await self.store.delete(tenant_of(request, None), rid):
            raise not_found(rid)
        return JSONResponse(DeletedResponse(id=rid).model_dump())

    async def cancel(self, rid: str, request: Request) -> Response:
        """Cancels a response in progress (its create call then answers it as cancelled)."""
        tenant = tenant_of(request, None)
        running = self.running.get((tenant, rid))
        if running is None:
            if self.store.get(tenant, rid) is not None:
                raise APIError(f"response {rid!r} has finished: only a response in progress "
                               "can be cancelled", param="response_id")
            raise not_found(rid)
        await self.chat.manager.abort(rid)
        return JSONResponse({**running.model_dump(), "status": "cancelled"})


def not_found(rid: str) -> APIError:
    return APIError(f"no response with id {rid!r} is stored for this API key (never stored, "
                    "deleted, expired, or another key's)", status=404, code="not_found",
                    param="response_id")


def output_messages(items: list[OutputItem]) -> list[ChatMessage]:
    """A response's output as the assistant turn the next turn's template renders (made here,
    so not validated again: a long output's calls may pass the bounds set on requests)."""
    reasoning = "".join(c.text for item in items if isinstance(item, OutputReasoning)
                        for c in item.content)
    text = "".join(c.text for item in items if isinstance(item, OutputMessage)
                   for c in item.content)
    calls = [ToolCallIn.model_construct(id=item.call_id, type="function",
                                        function=FunctionCallIn.model_construct(
                                            name=item.name, arguments=item.arguments))
             for item in items if isinstance(item, OutputFunctionCall)]
    return [ChatMessage.model_construct(
        role="assistant", content=text if text or not calls else None, tool_calls=calls or None,
        reasoning_content=reasoning or None, name=None, tool_call_id=None)]


class ItemWriter:
    """A choice's segments as the Responses API's item events, numbered in sequence; keeps the
    items whole for the final response."""

    def __init__(self) -> None:
        self.segments = SegmentTracker()
        self.items: list[OutputItem] = []
        self.sequence = 0

    def event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return named_sse(kind, payload)

    def write(self, piece: ChoicePiece) -> list[bytes]:
        return [e for s in self.segments.feed(piece) for e in self.render(s, "completed")]

    def close(self, status: str) -> list[bytes]:
        """The end of the output; an empty output is one empty message, as non-streamed."""
        segments = self.segments.close() if self.items else [Segment("open", "text"),
                                                              Segment("close", "text")]
        return [e for s in segments for e in self.render(s, status)]

    def render(self, segment: Segment, status: str) -> list[bytes]:
        if segment.op == "open":
            return self.open(segment)
        item = self.items[-1]
        at = {"item_id": item.id, "output_index": len(self.items) - 1}
        if segment.op == "append":
            if isinstance(item, OutputReasoning):
                item.content[0].text += segment.text
                return [self.event("response.reasoning_text.delta", **at, content_index=0,
                                   delta=segment.text)]
            if isinstance(item, OutputMessage):
                item.content[0].text += segment.text
                return [self.event("response.output_text.delta", **at, content_index=0,
                                   delta=segment.text, logprobs=[])]
            item.arguments += segment.text
            return [self.event("response.function_call_arguments.delta", **at,
                               delta=segment.text)]
        item.status = status  # type: ignore[assignment]
        if isinstance(item, OutputFunctionCall):
            done = [self.event("response.function_call_arguments.done", **at,
                               arguments=item.arguments, name=item.name)]
        else:
            part = item.content[0]
            text_done = ("response.reasoning_text.done" if isinstance(item, OutputReasoning)
                         else "response.output_text.done")
            extra = {} if isinstance(item, OutputReasoning) else {"logprobs": []}
            done = [self.event(text_done, **at, content_index=0, text=part.text, **extra),
                    self.event("response.content_part.done", **at, content_index=0,
                               part=part.model_dump())]
        return [*done, self.event("response.output_item.done", **at, item=item.model_dump())]

    def open(self, segment: Segment) -> list[bytes]:
        item: OutputItem
        part: OutputText | ReasoningText | None = None
        if segment.kind == "reasoning":
            part = ReasoningText(text="")
            item = OutputReasoning(id=new_id("rs"), content=[part], status="in_progress")
        elif segment.kind == "text":
            part = OutputText(text="")
            item = OutputMessage(id=new_id("msg"), content=[part], status="in_progress")
        else:
            item = OutputFunctionCall(id=new_id("fc"), call_id=segment.call_id or new_id("call"),
                                      name=segment.name or "", arguments="",
                                      status="in_progress")
        self.items.append(item)
        at = {"output_index": len(self.items) - 1}
        shown = item.model_dump()
        if part is not None:  # the item as added: its part arrives in content_part.added
            shown["content"] = []
        events = [self.event("response.output_item.added", **at, item=shown)]
        if part is not None:
            events.append(self.event("response.content_part.added", item_id=item.id, **at,
                                     content_index=0, part=part.model_dump()))
        return events
