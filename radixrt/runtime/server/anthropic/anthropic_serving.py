"""The handlers behind POST /v1/messages and POST /v1/messages/count_tokens (Anthropic's
Messages API). A request becomes the one chat request (anthropic_protocol.to_chat_request) and
takes the chat path (OpenAIServing.prepare_chat: template, tool grammar, reasoning, limits) and
the same runtime streams; only the output is written in Anthropic's blocks and events.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from radixrt.runtime.server.anthropic.anthropic_protocol import (
    CountTokensOut,
    CountTokensRequest,
    MessageOut,
    MessagesRequest,
    MessageUsage,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    stop_reason_of,
    tool_input,
)
from radixrt.runtime.server.core.error_shapes import anthropic_error_body, error_message, translated
from radixrt.runtime.server.core.http_streaming import (
    PrimedStream,
    SSEResponse,
    merge_streams,
)
from radixrt.runtime.server.core.http_streaming import named_sse as event
from radixrt.runtime.server.openai.chat_output import (
    ChoiceParser,
    ChoicePiece,
    Segment,
    SegmentTracker,
    new_id,
)
from radixrt.runtime.server.openai.openai_protocol import ChatRequest
from radixrt.runtime.server.openai.openai_serving import OpenAIServing


class AnthropicServing:
    def __init__(self, chat: OpenAIServing) -> None:
        self.chat = chat

    async def count_tokens(self, body: CountTokensRequest) -> Response:
        prepared = await self.chat.prepare_chat(translated(body.to_chat), generate=False,
                                                named_parallel=True)
        return JSONResponse(CountTokensOut(input_tokens=len(prepared.ids)).model_dump())

    async def messages(self, body: MessagesRequest, request: Request) -> Response:
        chat = translated(body.to_chat_request)
        # Anthropic's named tool may be called several times (parallel_tool_calls says)
        prepared = await self.chat.prepare_chat(chat, named_parallel=True)
        plan, ids, params = prepared.parts()
        mid = new_id("msg")
        streams = await self.chat.open(request, chat, [ids], [params], mid,
                                       images=[prepared.images])
        if body.stream:
            parser = self.chat.choice_parser(plan)
            return SSEResponse(self.stream(chat, parser, streams[0], len(ids), mid))
        out = (await self.chat.collect(request, streams, [ids], 1))[0]
        sample = out.samples[0]
        parser = self.chat.choice_parser(plan)
        parser.feed(sample.text)
        parser.finish()
        message = parser.message()
        content: list[TextBlock | ThinkingBlock | ToolUseBlock] = []
        if message.reasoning_content:
            content.append(ThinkingBlock(thinking=message.reasoning_content))
        if message.content or not message.tool_calls:
            content.append(TextBlock(text=message.content or ""))
        for call in message.tool_calls or ():
            content.append(ToolUseBlock(id=call.id, name=call.function.name,
                                        input=tool_input(call.function.arguments)))
        reason, stop_sequence = stop_reason_of(sample.finish_reason, sample.matched_stop,
                                               parser.has_calls)
        response = MessageOut(
            id=mid, model=body.model, content=content, stop_reason=reason,
            stop_sequence=stop_sequence,
            usage=MessageUsage.of(out.prompt_tokens, out.completion_tokens, out.cached_tokens))
        return JSONResponse(response.model_dump())

    async def stream(self, chat: ChatRequest, parser: ChoiceParser, stream: PrimedStream,
                     prompt_tokens: int, mid: str) -> AsyncGenerator[bytes, None]:
        """Anthropic's event sequence: message_start, then per block content_block_start,
        its deltas, content_block_stop; message_delta (stop reason, usage); message_stop."""
        blocks = BlockWriter()
        output_tokens = 0
        started = False
        async for _, chunk in merge_streams([stream]):
            if not started:
                started = True
                usage = MessageUsage.of(prompt_tokens, 0, chunk.cached_tokens)
                start = MessageOut(id=mid, model=chat.model, content=[], usage=usage)
                yield event("message_start", {"type": "message_start",
                                              "message": start.model_dump()})
            output_tokens += len(chunk.token_ids)
            failure = error_message(chunk.finish_reason)
            if failure is not None:
                yield event("error", anthropic_error_body(failure, 500))
                return
            for item in blocks.write(parser.feed(chunk.text)):
                yield item
            if chunk.finish_reason is None:
                continue
            for item in blocks.write(parser.finish()):
                yield item
            for item in blocks.close():
                yield item
            reason, stop_sequence = stop_reason_of(chunk.finish_reason, chunk.matched_stop,
                                                   parser.has_calls)
            yield event("message_delta", {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
                "usage": {"output_tokens": output_tokens}})
            yield event("message_stop", {"type": "message_stop"})


class BlockWriter:
    """A choice's segments as Anthropic's block events: content_block_start (text, thinking or
    tool_use), its deltas, content_block_stop."""

    def __init__(self) -> None:
        self.segments = SegmentTracker()
        self.index = -1

    def write(self, piece: ChoicePiece) -> list[bytes]:
        return [self.render(s) for s in self.segments.feed(piece)]

    def close(self) -> list[bytes]:
        """The end of the output; an empty output is one empty text block, as non-streamed."""
        segments = self.segments.close() if self.index >= 0 else [Segment("open", "text"),
                                                                  Segment("close", "text")]
        return [self.render(s) for s in segments]

    def render(self, segment: Segment) -> bytes:
        if segment.op == "open":
            self.index += 1
            block = {"reasoning": {"type": "thinking", "thinking": "", "signature": ""},
                     "text": {"type": "text", "text": ""},
                     "call": {"type": "tool_use", "id": segment.call_id, "name": segment.name,
                              "input": {}}}[segment.kind]
            return event("content_block_start", {"type": "content_block_start",
                                                 "index": self.index, "content_block": block})
        if segment.op == "close":
            return event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        delta = {"reasoning": {"type": "thinking_delta", "thinking": segment.text},
                 "text": {"type": "text_delta", "text": segment.text},
                 "call": {"type": "input_json_delta", "partial_json": segment.text}}[segment.kind]
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                             "delta": delta})
