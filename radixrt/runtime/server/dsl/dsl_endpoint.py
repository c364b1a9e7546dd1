"""The ZeroMQ endpoint DSL clients talk to, in the tokenizer process: a ROUTER socket (ipc://
in the private directory, and tcp:// when asked for) speaking DslRequest / DslReply msgspec
messages. Each generate runs through the same TokenizerManager as HTTP requests.

Ops: generate (optionally streamed, optionally pinning its prefix in the radix cache), unpin,
score (the choices of a `select`), abort, info (server_info plus the chat template's roles, the
text that stands for an image where the model takes images, and the local folder of the
tokenizer), token_texts (token ids to their texts, each decoded on its own: what
gen(return_text_in_logprobs=True) shows). A generate may carry image files (rx.image;
dsl_images.py), and so may a score (select): its prompts carry them too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from radixrt.runtime.constrained.structural import fill_format, parse_tool_call_spec
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.messages import DslReply, DslRequest, DslSample, DslToolCall, Scheduling
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.core.http_replica import local_tokenizer_path
from radixrt.runtime.server.core.tenants import ApiKeys
from radixrt.runtime.server.dsl.dsl_images import images_of, program_chat, request_prompt
from radixrt.runtime.server.dsl.dsl_scoring import score_choices
from radixrt.runtime.server.openai.chat_tool_plan import ChatFeatures
from radixrt.runtime.server.openai.logprob_formats import TokenText
from radixrt.runtime.server.openai.reasoning_parsers import split_reasoning
from radixrt.runtime.server.openai.tool_parsers import parse_tool_calls
from radixrt.runtime.tokenizer.pin_leases import PinService
from radixrt.runtime.tokenizer.pooling_inputs import PoolingAborted, embed_params, pooled_result
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

log = logging.getLogger("radixrt.dsl")

MAX_TOKEN_TEXTS = 1 << 16  # op token_texts: ids per call


class DslEndpoint:
    def __init__(self, manager: TokenizerManager, addresses: list[str],
                 keys: ApiKeys | str | None = None, pins: PinService | None = None,
                 features: ChatFeatures | None = None) -> None:
        """keys: every request must carry one of them (the server's --api-key or
        --api-key-file), or nothing runs; a named key names its requests' tenant.
        pins: the process's pin leases (shared with the HTTP server). features: the server's
        tool-call format and reasoning parser (gen(tools=...), separate_reasoning)."""
        self.manager = manager
        self.pins = pins if pins is not None else PinService(manager)
        self.features = features if features is not None else ChatFeatures.of(manager.tokenizer)
        self._keys = ApiKeys.single(keys) if isinstance(keys, str) else keys
        self._ctx = zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        for address in addresses:
            self._sock.bind(address)
        self.addresses = addresses
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(DslRequest)
        self._calls: dict[tuple[bytes, int], asyncio.Task] = {}
        self._loop_task: asyncio.Task | None = None
        self._chat = program_chat(manager, self.features.tool_format)
        self._cache_on: bool | None = None  # the runtime's radix cache, read on first use
        self._token_text = TokenText(manager.tokenizer)

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._serve())

    async def close(self) -> None:
        for task in [self._loop_task, *self._calls.values()]:
            if task is not None:
                task.cancel()
        self._sock.close(linger=0)

    async def _serve(self) -> None:
        while True:
            identity, payload = await self._sock.recv_multipart()
            try:
                req = self._decoder.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                # the call's id where it can be read, so the caller's call fails, not hangs
                await self._reply(identity, DslReply(call_id=call_id_of(payload), done=True,
                                                     error=f"malformed request: {exc}"))
                continue
            found, tenant = self._authorize(req)
            if not found:
                await self._reply(identity, DslReply(
                    call_id=req.call_id, done=True,
                    error="this runtime needs its API key: pass api_key=... to "
                          "rx.RuntimeEndpoint (the server's --api-key)"))
                continue
            key = (identity, req.call_id)
            if req.op == "abort":
                task = self._calls.get(key)
                if task is not None:
                    task.cancel()
            elif req.op in ("info", "generate", "score", "embed", "unpin", "renew",
                            "flush_cache", "token_texts"):
                handler = getattr(self, f"_{req.op}")
                task = asyncio.create_task(self._run(handler, identity, req, tenant or ""))
                self._calls[key] = task
                task.add_done_callback(lambda _t, k=key: self._calls.pop(k, None))
            else:
                await self._reply(identity, DslReply(
                    call_id=req.call_id, done=True,
                    error=f"unknown op {req.op!r}: use generate, score, embed, unpin, renew, "
                          "abort, flush_cache, token_texts or info"))

    def _authorize(self, req: DslRequest) -> tuple[bool, str | None]:
        """(whether the request may run, its tenant: the name of its key, if named)."""
        if self._keys is None:
            return True, None
        return self._keys.match((req.api_key or "").encode())

    async def _run(self, handler: Any, identity: bytes, req: DslRequest, tenant: str) -> None:
        """Run one op; a refusal (ValueError, QueueFull) or a cancel becomes the call's final
        reply."""
        try:
            if req.op in ("generate", "score", "embed"):
                await handler(identity, req, Scheduling(priority=req.priority, tenant=tenant,
                                                        lora=req.lora))
            else:
                await handler(identity, req)
        except (ValueError, TypeError, QueueFull) as exc:
            await self._reply(identity, DslReply(call_id=req.call_id, done=True, error=str(exc)))
        except asyncio.CancelledError:
            await self._reply(identity, DslReply(call_id=req.call_id, done=True,
                                                 finish_reason="abort"))
        except Exception as exc:  # a bug here must still answer the client, never leave it waiting
            log.exception("DSL %s call failed", req.op)
            await self._reply(identity, DslReply(call_id=req.call_id, done=True,
                                                 error=f"internal error in {req.op}: {exc!r}"))

    async def _info(self, identity: bytes, req: DslRequest) -> None:
        info = await self.manager.server_info()
        info["chat"] = self._chat
        info.update(self.pins.info())
        path = local_tokenizer_path(self.manager.tokenizer)
        if path is not None:  # only a path on this machine (a client here may load it)
            info["model_path"] = path
        await self._reply(identity, DslReply(call_id=req.call_id, done=True, info=info))

    async def _flush_cache(self, identity: bytes, req: DslRequest) -> None:
        freed = await self.manager.flush_cache()
        await self._reply(identity, DslReply(call_id=req.call_id, done=True,
                                             info={"freed_tokens": freed}))

    async def _token_texts(self, identity: bytes, req: DslRequest) -> None:
        ids = list(req.input_ids or [])
        if len(ids) > MAX_TOKEN_TEXTS:
            raise ValueError(f"token_texts: {len(ids)} ids in one call, at most "
                             f"{MAX_TOKEN_TEXTS}")
        vocab = self.manager.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token_texts: ids {bad[:8]} are not in the vocabulary "
                             f"(0 <= id < {vocab})")
        texts = [self._token_text(t) for t in ids]
        await self._reply(identity, DslReply(call_id=req.call_id, done=True,
                                             info={"texts": texts}))

    async def _unpin(self, identity: bytes, req: DslRequest) -> None:
        await self.pins.release(req.pin_id)  # unknown: its lease ran out, released already
        await self._reply(identity, DslReply(call_id=req.call_id, done=True))

    async def _renew(self, identity: bytes, req: DslRequest) -> None:
        lost = self.pins.renew(req.pin_ids)
        await self._reply(identity, DslReply(call_id=req.call_id, done=True,
                                             info={"lost": lost}))

    async def _score(self, identity: bytes, req: DslRequest, scheduling: Scheduling) -> None:
        pictures = await images_of(self.manager, req)
        if self._cache_on is None:
            info = await self.manager.server_info()
            self._cache_on = not info.get("disable_radix_cache", False)
        choices = await score_choices(self.manager, req.text or "", list(req.choices),
                                      req.unconditional, prefill_first=self._cache_on,
                                      scheduling=scheduling, images=pictures)
        await self._reply(identity, DslReply(call_id=req.call_id, done=True, choices=choices))

    async def _embed(self, identity: bytes, req: DslRequest, scheduling: Scheduling) -> None:
        prompt: Any = req.input_ids if req.input_ids is not None else req.text
        if prompt is None:
            raise ValueError("give `text` or `input_ids`")
        if req.images:
            raise ValueError("embed takes no images: give text only")
        ids = self.manager.encode(prompt)
        params = embed_params(self.manager.pooling, req.dimensions)
        vector: list[float] = []
        cached, reason = 0, None
        stream = self.manager.generate(ids, params, scheduling=scheduling)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                vector = chunk.pooled or vector
                cached, reason = chunk.cached_tokens, chunk.finish_reason
        try:
            vector = pooled_result(vector, reason, 0)
        except PoolingAborted:
            await self._reply(identity, DslReply(call_id=req.call_id, done=True,
                                                 finish_reason="abort"))
            return
        await self._reply(identity, DslReply(call_id=req.call_id, done=True, embedding=vector,
                                             prompt_tokens=len(ids), cached_tokens=cached))

    async def _generate(self, identity: bytes, req: DslRequest,
                        scheduling: Scheduling) -> None:
        params = self._with_features(req.params,
                                     req.separate_reasoning)
        ids, images = await request_prompt(self.manager, req)
        samples = [[[], [], [], None] for _ in range(params.n)]  # text, ids, logprobs, reason
        cached = 0
        prompt_logprobs: list = []
        pin_id, pin_error = -1, None
        stream = self.manager.generate(ids, params, pin=req.pin, scheduling=scheduling,
                                       images=images)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                text, tokens, lps, _ = samples[chunk.index]
                text.append(chunk.text)
                tokens.extend(chunk.token_ids)
                lps.extend(chunk.logprobs)
                samples[chunk.index][3] = chunk.finish_reason
                cached = chunk.cached_tokens
                prompt_logprobs = prompt_logprobs or list(chunk.prompt_logprobs)
                if chunk.pinned:  # under a lease already (the pin service heard of it)
                    pin_id = chunk.rid
                pin_error = pin_error or chunk.pin_error
                if req.stream:
                    await self._reply(identity, DslReply(
                        call_id=req.call_id, done=False, index=chunk.index, text=chunk.text,
                        token_ids=list(chunk.token_ids), finish_reason=chunk.finish_reason,
                        logprobs=list(chunk.logprobs), prompt_tokens=len(ids),
                        cached_tokens=chunk.cached_tokens))
        final = [self._sample("".join(t), i, r, lp, params, req.separate_reasoning)
                 for t, i, lp, r in samples]
        await self._reply(identity, DslReply(
            call_id=req.call_id, done=True, text=final[0].text,
            token_ids=final[0].token_ids, finish_reason=final[0].finish_reason,
            logprobs=final[0].logprobs, prompt_logprobs=prompt_logprobs,
            prompt_tokens=len(ids), cached_tokens=cached,
            samples=final, pin_id=pin_id, pin_error=pin_error))

    def _with_features(self, params: SamplingParams, separate_reasoning: bool) -> SamplingParams:
        """A gen(tools=...)'s spec in the server's tool-call format; with separate_reasoning,
        its constraint after the thinking."""
        if params.tool_calls is not None:
            spec = parse_tool_call_spec(fill_format(params.tool_calls,
                                                    self.features.tool_format.name))
            params = params.with_(tool_calls=spec.to_json())
        if separate_reasoning:
            if self.features.reasoning is None:
                raise ValueError("separate_reasoning needs a reasoning model: start the server "
                                 "with --reasoning-parser")
            if params.constraint is not None:
                params = params.with_(reasoning_format=self.features.reasoning.name)
        return params

    def _sample(self, text: str, ids: list[int], reason: str | None, logprobs: list,
                params: SamplingParams, separate_reasoning: bool) -> DslSample:
        reasoning, content = None, None
        answer = text
        if separate_reasoning and self.features.reasoning is not None:
            reasoning, content = split_reasoning(self.features.reasoning, text)
            answer = content
        calls: list[DslToolCall] = []
        if params.tool_calls is not None:
            fmt = parse_tool_call_spec(params.tool_calls).format
            calls = [DslToolCall(c.name, c.arguments) for c in parse_tool_calls(fmt, answer)[1]]
        return DslSample(text, ids, reason, logprobs, calls, reasoning, content)

    async def _reply(self, identity: bytes, reply: DslReply) -> None:
        await self._sock.send_multipart([identity, self._encoder.encode(reply)])


class CallIdOnly(msgspec.Struct):
    """A DslRequest's call_id alone (other fields ignored): read from a request that failed to
    decode as a whole, so its reply reaches the call that sent it."""

    call_id: int = -1


def call_id_of(payload: bytes) -> int:
    try:
        return msgspec.msgpack.decode(payload, type=CallIdOnly).call_id
    except (msgspec.DecodeError, msgspec.ValidationError):
        return -1
