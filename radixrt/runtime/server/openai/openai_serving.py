"""The handlers behind POST /v1/completions and POST /v1/chat/completions."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.core.http_streaming import (
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
from radixrt.runtime.server.core.image_parts import encode_with_images, load_images
from radixrt.runtime.server.core.tenants import scheduling_for
from radixrt.runtime.server.openai.chat_output import ChoiceParser, finish_reason_with_calls
from radixrt.runtime.server.openai.chat_tool_plan import (
    ChatFeatures,
    ChatToolPlan,
    plan_chat,
    template_messages,
)
from radixrt.runtime.server.openai.logprob_formats import (
    TokenText,
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
)
from radixrt.runtime.server.openai.openai_protocol import (
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatRequest,
    ChatResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    SamplingFields,
    Usage,
    constraint_fields,
    finish_reason_out,
    to_sampling_params,
)
from radixrt.runtime.tokenizer.chat_tool_prompts import render_chat
from radixrt.runtime.tokenizer.prompts import Prompt
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

# Bounds of a request as a whole, checked before it runs: a completion may batch this many
# prompts, n samples each, up to this many samples; a chat has at most this many messages.
MAX_PROMPTS_PER_REQUEST = 128
MAX_SAMPLES_PER_REQUEST = 256
MAX_CHAT_MESSAGES = 1024
MODEL_ALIAS = "default"  # clients may send this as `model` instead of the served model's name


class OpenAIServing:
    def __init__(self, manager: TokenizerManager, features: ChatFeatures | None = None) -> None:
        """features: tool calls and reasoning (the server's --tool-call-parser, ...)."""
        self.manager = manager
        self.token_text = TokenText(manager.tokenizer)
        self.features = features if features is not None else ChatFeatures.of(manager.tokenizer)

    # --- shared steps ----------------------------------------------------------------------

    def check_model(self, model: str) -> None:
        if model not in (self.manager.model_name, MODEL_ALIAS) and model not in self.manager.loras:
            adapters = ", ".join(repr(name) for name in self.manager.loras)
            raise APIError(
                f"model {model!r} is not served here: use {self.manager.model_name!r} "
                f"(or {MODEL_ALIAS!r})" + (f" or a LoRA adapter ({adapters})" if adapters
                                           else "") + "; GET /v1/models lists them",
                param="model", code="model_not_found",
            )

    def adapter_of(self, model: str) -> str | None:
        """The LoRA adapter a request's `model` names (None: the base model)."""
        if model in (self.manager.model_name, MODEL_ALIAS):
            return None
        return model if model in self.manager.loras else None

    def encode(self, prompt: Prompt, param: str) -> list[int]:
        try:  # the limits that need the model are checked where the request is queued
            return self.manager.encode(prompt)
        except ValueError as exc:
            raise APIError(str(exc), param=param) from None

    def params_for(
        self, fields: SamplingFields, max_tokens: int | None, top: int | None,
        logprobs: bool, prompt_logprobs_start: int | None = None,
        constraint: dict[str, Any] | None = None,
    ) -> SamplingParams:
        """constraint: the constraint fields to use instead of the request's own."""
        return to_sampling_params(
            fields, max_tokens, logprobs=logprobs, top_logprobs=top or 0,
            prompt_logprobs_start=prompt_logprobs_start, constraint=constraint,
        )

    async def open(
        self, request: Request, body: SamplingFields, ids_list: list[list[int]],
        params_list: list[SamplingParams], rid: str, pin: bool = False,
        images: list[list[ImageInput]] | None = None,
    ) -> list[PrimedStream]:
        """pin: each finished prompt and output stay cached under a pin (the pin service's
        lease); its final chunk says whether (the stream's rid is the pin id). images: each
        prompt's (PreparedChat.images)."""
        scheduling = scheduling_for(request, body, lora=self.adapter_of(body.model))
        opening = open_streams(self.manager, ids_list, params_list, rid, scheduling, pin, images)
        return await until_disconnected(request, opening)

    async def collect(
        self, request: Request, streams: list[PrimedStream], ids_list: list[list[int]], n: int
    ) -> list[PromptOutput]:
        collecting = collect_all(streams, [len(ids) for ids in ids_list], n)
        return await until_disconnected(request, collecting)

    # --- /v1/completions -------------------------------------------------------------------

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self.check_model(body.model)
        if body.max_tokens == 0 and not body.echo:
            raise APIError("max_tokens=0 is invalid without echo=true (which scores the prompt "
                           "only): set max_tokens >= 1", param="max_tokens")
        prompts = split_prompts(body.prompt)
        ids_list = [self.encode(p, "prompt") for p in prompts]
        params = [self.completion_params(body)] * len(ids_list)  # the same for every prompt
        if len(prompts) * params[0].n > MAX_SAMPLES_PER_REQUEST:
            raise APIError(f"{len(prompts)} prompts x n={params[0].n} make "
                           f"{len(prompts) * params[0].n} samples; one request may ask for at "
                           f"most {MAX_SAMPLES_PER_REQUEST}: split it", param="n")
        echoes = [self.echo_of(body, p, ids) for p, ids in zip(prompts, ids_list)]
        rid = f"cmpl-{uuid.uuid4().hex}"
        n = params[0].n
        streams = await self.open(request, body, ids_list, params, rid)
        if body.stream:
            return SSEResponse(self.stream_completions(body, streams, n, echoes, ids_list, rid))
        outputs = await self.collect(request, streams, ids_list, n)
        choices = [c for i, out in enumerate(outputs)
                   for c in self.completion_choices(body, i * n, out, echoes[i])]
        response = CompletionResponse(
            id=rid, model=body.model, choices=choices, usage=usage_of(outputs)
        )
        return JSONResponse(response.model_dump())

    def completion_choices(
        self, body: CompletionRequest, first_index: int, out: PromptOutput, echo: Echo | None
    ) -> list[CompletionChoice]:
        """The n choices of one prompt, numbered from first_index."""
        if echo is not None:
            echo.logprobs = out.prompt_logprobs
        return [
            self.completion_choice(body, first_index + j, sample.text, sample.logprobs,
                                   sample.finish_reason, 0, echo)
            for j, sample in enumerate(out.samples)
        ]

    def completion_params(self, body: CompletionRequest) -> SamplingParams:
        """max_tokens=0 with echo scores the prompt only: a prefill-only request."""
        start = 1 if body.echo and body.logprobs is not None else None  # position 0: no logprob
        return self.params_for(body, body.max_tokens, body.logprobs, body.logprobs is not None,
                               prompt_logprobs_start=start)

    def echo_of(self, body: CompletionRequest, prompt: Prompt, ids: list[int]) -> Echo | None:
        if not body.echo:
            return None
        text = prompt if isinstance(prompt, str) else self.manager.tokenizer.decode(ids)
        return Echo(text=text, ids=ids)

    def completion_choice(
        self, body: CompletionRequest, index: int, text: str, logprobs: list[TokenLogprob],
        finish_reason: str | None, offset: int, echo: Echo | None,
    ) -> CompletionChoice:
        """One choice (or one streamed piece of it); `echo` puts the prompt before `text`, and
        its tokens before `logprobs`, whose text offsets then start after the prompt."""
        if echo is not None:
            text, offset = echo.text + text, offset + len(echo.text)
        lp = None
        if body.logprobs is not None:
            lp = completion_logprobs(self.token_text, logprobs, offset)
            if echo is not None:
                lp = echo_logprobs(self.token_text, echo.ids[0], echo.logprobs).extend(lp)
        return CompletionChoice(index=index, text=text, logprobs=lp,
                                finish_reason=finish_reason_out(finish_reason))

    async def stream_completions(
        self, body: CompletionRequest, streams: list[PrimedStream], n: int,
        echoes: list[Echo | None], ids_list: list[list[int]], rid: str,
    ) -> AsyncGenerator[bytes, None]:
        """Each choice's first chunk carries the echoed prompt (and its logprobs), if asked."""
        tally = StreamTally([len(ids) for ids in ids_list])
        offsets: dict[int, int] = {}  # choice index -> characters of its text sent
        async for i, chunk in merge_streams(streams):
            tally.add(i, chunk)
            index = i * n + chunk.index
            echo = echoes[i] if index not in offsets else None
            if echo is not None and chunk.prompt_logprobs:
                echo.logprobs = chunk.prompt_logprobs
            choice = self.completion_choice(body, index, chunk.text, chunk.logprobs,
                                            chunk.finish_reason, offsets.get(index, 0), echo)
            offsets[index] = offsets.get(index, 0) + len(choice.text)
            yield sse(CompletionResponse(id=rid, model=body.model, choices=[choice]).model_dump())
        if body.include_usage:
            final = CompletionResponse(id=rid, model=body.model, choices=[], usage=tally.usage())
            yield sse(final.model_dump())
        yield SSE_DONE

    # --- /v1/chat/completions --------------------------------------------------------------

    async def prepare_chat(self, body: ChatRequest, generate: bool = True,
                           named_parallel: bool = False) -> PreparedChat:
        """The one chat path every chat-shaped surface takes (/v1/chat/completions, /v1/messages,
        /v1/responses): the checks, the tool plan, the images, the rendered prompt and
        (generate=False: only counting the prompt's tokens) the sampling params.
        named_parallel: a named tool choice may make several calls (Anthropic's)."""
        self.check_model(body.model)
        if not body.messages:
            raise APIError("messages is empty: send at least one message", param="messages")
        if len(body.messages) > MAX_CHAT_MESSAGES:
            raise APIError(f"messages has {len(body.messages)} messages; at most "
                           f"{MAX_CHAT_MESSAGES} are accepted", param="messages")
        if body.top_logprobs and not body.logprobs:
            raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
        if body.echo:
            raise APIError("echo is not supported on /v1/chat/completions: send the rendered "
                           "prompt to /v1/completions with echo=true", param="echo")
        plan = plan_chat(body, self.features, constraint_fields(body), named_parallel)
        urls = [url for message in body.messages for url in message.images()]
        images = await load_images(self.manager, urls, "messages")
        ids, shown = await encode_with_images(self.manager, self.render(body, plan), images,
                                              "messages")
        if not generate:
            return PreparedChat(plan, ids, None, shown)
        max_tokens = body.max_completion_tokens
        if max_tokens is None:
            max_tokens = body.max_tokens
        if max_tokens == 0:  # prefill only: /v1/completions' echo scores a prompt
            raise APIError("max_tokens=0 is invalid: must be >= 1 (a chat completion generates "
                           "at least one token)", param="max_tokens")
        params = self.params_for(body, max_tokens, body.top_logprobs, body.logprobs,
                                 constraint=plan.constraint)
        return PreparedChat(plan, ids, params, shown)

    async def chat(self, body: ChatRequest, request: Request) -> Response:
        prepared = await self.prepare_chat(body)
        plan, ids, params = prepared.parts()
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await self.open(request, body, [ids], [params], rid, images=[prepared.images])
        if body.stream:
            return SSEResponse(self.stream_chat(body, plan, streams[0], len(ids), rid))
        out = (await self.collect(request, streams, [ids], params.n))[0]
        choices = []
        for j, sample in enumerate(out.samples):
            parser = self.choice_parser(plan)
            parser.feed(sample.text)
            parser.finish()
            choices.append(ChatChoice(
                index=j, message=parser.message(),
                logprobs=chat_logprobs(self.token_text, sample.logprobs) if body.logprobs else None,
                finish_reason=finish_reason_with_calls(finish_reason_out(sample.finish_reason),
                                                       parser.has_calls),
            ))
        response = ChatResponse(id=rid, model=body.model, choices=choices, usage=usage_of([out]))
        return JSONResponse(response.model_dump())

    def render(self, body: ChatRequest, plan: ChatToolPlan) -> list[int]:
        try:
            return render_chat(self.manager.tokenizer, template_messages(body), plan.tools,
                               plan.template_kwargs, self.features.tool_format,
                               self.features.native_tools, body.continue_final_message)
        except (ValueError, TypeError) as exc:
            raise APIError(str(exc), param="messages") from None

    def choice_parser(self, plan: ChatToolPlan) -> ChoiceParser:
        return ChoiceParser(self.features.tool_format if plan.parse_calls else None,
                            plan.reasoning)

    async def stream_chat(
        self, body: ChatRequest, plan: ChatToolPlan, stream: PrimedStream, prompt_tokens: int,
        rid: str,
    ) -> AsyncGenerator[bytes, None]:
        """Each choice's text goes through its parser: thinking to reasoning_content, calls to
        tool_calls deltas, undecided text (a partial opener) held back until it is decided."""
        tally = StreamTally([prompt_tokens])
        parsers: dict[int, ChoiceParser] = {}
        async for _, chunk in merge_streams([stream]):
            tally.add(0, chunk)
            first = chunk.index not in parsers
            if first:
                parsers[chunk.index] = self.choice_parser(plan)
            parser = parsers[chunk.index]
            piece = parser.feed(chunk.text)
            reason = finish_reason_out(chunk.finish_reason)
            if reason is not None:
                rest = parser.finish()
                piece.reasoning += rest.reasoning
                piece.content += rest.content
                piece.calls += rest.calls
                reason = finish_reason_with_calls(reason, parser.has_calls)
            delta = piece.delta()
            if first:
                delta.role = "assistant"
            lp = chat_logprobs(self.token_text, chunk.logprobs) if body.logprobs else None
            if piece.empty() and not first and reason is None and not (lp and lp.content):
                continue  # everything held back: nothing to say yet
            choice = ChatChunkChoice(index=chunk.index, delta=delta, logprobs=lp,
                                     finish_reason=reason)
            yield sse(ChatChunk(id=rid, model=body.model, choices=[choice]).model_dump())
        if body.include_usage:
            yield sse(ChatChunk(id=rid, model=body.model, choices=[], usage=tally.usage())
                      .model_dump())
        yield SSE_DONE


# --- helpers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedChat:
    """A chat request ready to run: its tool plan, prompt ids, params (None: count only) and
    images (their placeholders in ids)."""

    plan: ChatToolPlan
    ids: list[int]
    params: SamplingParams | None
    images: list[ImageInput] = field(default_factory=list)

    def parts(self) -> tuple[ChatToolPlan, list[int], SamplingParams]:
        assert self.params is not None
        return self.plan, self.ids, self.params


@dataclass
class Echo:
    """What echo=true puts before each choice of one prompt: its text and its tokens (with the
    runtime's logprobs of all but the first, once they arrive, when logprobs are asked for)."""

    text: str
    ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)


def split_prompts(prompt: str | list[str] | list[int] | list[list[int]]) -> list[Prompt]:
    """One prompt (a str or a list of token ids) or a batch of them."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError("prompt is empty: give text, token ids or a list of them", param="prompt")
    if isinstance(prompt[0], int):
        return [prompt]  # type: ignore[list-item]
    if len(prompt) > MAX_PROMPTS_PER_REQUEST:
        raise APIError(f"prompt is a list of {len(prompt)} prompts; one request may batch at "
                       f"most {MAX_PROMPTS_PER_REQUEST}: split it", param="prompt")
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


def model_card(name: str, parent: str | None = None,
               root: str | None = None) -> dict[str, Any]:
    """An entry of /v1/models; a LoRA adapter's names its base model as `parent` and its
    folder as `root` (vLLM's fields)."""
    card = {"id": name, "object": "model", "created": 0, "owned_by": "radixrt"}
    if parent is not None:
        card.update(parent=parent, root=root)
    return card
