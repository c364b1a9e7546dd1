"""The native API: SGLang's /generate protocol (native_protocol.py has the shapes), pins, and
/concate_and_append_request.

/generate takes one prompt or a batch ("text" / "input_ids" lists), n samples each, and answers one
{"text", "output_ids", "meta_info"} object (one prompt, n = 1) or a list of them, prompt-major
("index" = prompt * n + sample). Streamed, each event is one sample's state so far, as SGLang's
server sends it: the text and output ids so far, meta_info with the logprobs so far, and its
"index"; then `data: [DONE]`.

Pins: with "pin": true (n = 1, no stop strings) the finished prompt and output stay locked in the
radix cache, so later requests that start with them never recompute them; meta_info then has
"pin_id" (null when the pin was refused, with "pin_error" saying why: the pin budget). A pin is a
lease: POST /renew_pins {"pin_ids": [...]} more often than server_info's pin_lease_ttl_s keeps it
(the reply lists the ones already "lost"), POST /unpin {"pin_id": N} releases it; one its client
stops renewing is released by the server.

/concate_and_append_request {"src_rids": [...], "dst_rid": r}: every source request's sequence must
continue the destination's (SGLang's forks of one state); the destination becomes its own tokens
followed by each source's tokens past it, in order, and that sequence is prefilled as a
prefill-only request: the part the radix tree holds (the destination and the first source) is read
from it, the rest is computed at its true positions. Ids are the meta_info "id"s of earlier
/generate requests in the same tenant and cache namespace (sequence_registry.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from radixrt.runtime.config import INT64_MAX, MAX_PINS_PER_RENEWAL
from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.core.error_shapes import APIError, error_message
from radixrt.runtime.server.core.http_streaming import (
    SSE_DONE,
    PrimedStream,
    SampleOutput,
    SSEResponse,
    merge_streams,
    open_streams,
    sse,
    until_disconnected,
)
from radixrt.runtime.server.core.image_parts import (
    encode_with_images,
    load_images,
    native_image_refs,
)
from radixrt.runtime.server.core.tenants import scheduling_for
from radixrt.runtime.server.native.native_protocol import (
    ConcatAppendBody,
    GenerateRequest,
    check_unserved,
    finish_reason,
    logprob_triples,
    per_prompt,
    sampling_values,
    top_triples,
)
from radixrt.runtime.server.native.sequence_registry import Namespace, SequenceRegistry
from radixrt.runtime.server.openai.logprob_formats import TokenText
from radixrt.runtime.server.openai.openai_protocol import build_sampling_params
from radixrt.runtime.server.openai.openai_serving import (
    MAX_PROMPTS_PER_REQUEST,
    MAX_SAMPLES_PER_REQUEST,
)
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager


class UnpinBody(BaseModel):
    pin_id: Annotated[int, Field(ge=0, le=INT64_MAX)]


class RenewPinsBody(BaseModel):
    pin_ids: Annotated[list[Annotated[int, Field(ge=0, le=INT64_MAX)]],
                       Field(max_length=MAX_PINS_PER_RENEWAL)]


@dataclass
class NativePrompt:
    """One prompt of a /generate request: its tokens, params and SGLang options."""

    ids: list[int]
    params: SamplingParams
    rid: str
    logprob_start: int | None  # SGLang's logprob_start_len (None: no input logprobs)
    images: list[ImageInput] = field(default_factory=list)  # placeholders in ids


@dataclass
class NativeRun:
    """One prompt's samples and what the runtime said of its prompt."""

    prompt: NativePrompt
    samples: list[SampleOutput]
    started: float
    cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    pinned: bool = False
    pin_error: str | None = None
    runtime_rid: int | None = None
    base: int = 0  # the first sample's index in the request (prompt-major numbering)

    def add(self, chunk: StreamChunk) -> None:
        self.cached_tokens = max(self.cached_tokens, chunk.cached_tokens)
        self.prompt_logprobs += chunk.prompt_logprobs
        self.pinned = self.pinned or chunk.pinned
        self.pin_error = self.pin_error or chunk.pin_error
        self.runtime_rid = chunk.rid if self.runtime_rid is None else self.runtime_rid
        self.samples[chunk.index].add(chunk)


class NativeServing:
    def __init__(self, manager: TokenizerManager, registry: SequenceRegistry | None = None) -> None:
        self.manager = manager
        self.registry = registry or SequenceRegistry()
        self.token_text = TokenText(manager.tokenizer)

    @property
    def eos_ids(self) -> frozenset[int]:
        """The model's EOS ids (known once the runtime is up)."""
        return frozenset(int(t) for t in self.manager.link.info.get("eos_token_ids", ()))

    # --- request -> prompts ------------------------------------------------------------------
    async def encode(self, body: GenerateRequest
                     ) -> tuple[list[tuple[list[int], list[ImageInput]]], bool]:
        """The prompts' token ids and images, and whether the request is a batch."""
        if (body.text is None) == (body.input_ids is None):
            raise APIError("give exactly one of 'text' and 'input_ids'", param="text")
        param = "text" if body.text is not None else "input_ids"
        given = body.text if body.text is not None else body.input_ids
        batch = self.batch(body)
        prompts: Sequence[Any] = given if batch else [given]  # type: ignore[assignment]
        if batch and not prompts:
            raise APIError(f"'{param}' is an empty batch", param=param)
        if len(prompts) > MAX_PROMPTS_PER_REQUEST:
            raise APIError(f"{len(prompts)} prompts in one request; at most "
                           f"{MAX_PROMPTS_PER_REQUEST}: split it", param=param)
        refs = native_image_refs(body.image_data, len(prompts), batch)
        loaded = iter(await load_images(self.manager, [r for some in refs for r in some],
                                        "image_data"))  # all at once, bounded as one request's
        out = []
        for prompt, some in zip(prompts, refs):  # the model's limits: where it is queued
            images = [next(loaded) for _ in some]
            out.append(await encode_with_images(self.manager, prompt, images,
                                                "image_data" if images else param))
        return out, batch

    async def prompts(self, body: GenerateRequest) -> list[NativePrompt]:
        check_unserved(body)
        encoded, batch = await self.encode(body)
        count = len(encoded)
        params = per_prompt(body.sampling_params or {}, count, "sampling_params", batch)
        wants = per_prompt(body.return_logprob or False, count, "return_logprob", batch)
        starts = per_prompt(body.logprob_start_len, count, "logprob_start_len", batch)
        tops = per_prompt(body.top_logprobs_num or 0, count, "top_logprobs_num", batch)
        rids = per_prompt(body.rid, count, "rid", batch)
        if batch and body.rid is not None and not isinstance(body.rid, list):
            raise APIError("a batch needs one 'rid' per prompt (a list)", param="rid")
        out = []
        for (ids, images), values, want, start, top, rid in zip(encoded, params, wants, starts,
                                                                tops, rids):
            out.append(self.prompt(ids, values, want, start, top, rid))
            out[-1].images = images
        samples = sum(p.params.n for p in out)
        if samples > MAX_SAMPLES_PER_REQUEST:
            raise APIError(f"{count} prompts make {samples} samples; one request may ask for at "
                           f"most {MAX_SAMPLES_PER_REQUEST}", param="sampling_params")
        if body.pin:
            self.check_pin([p.params for p in out])
        return out

    def prompt(self, ids: list[int], values: dict[str, Any], want: bool, start: int | None,
               top: int, rid: str | None) -> NativePrompt:
        fields = sampling_values(values)
        if start is not None and start < -1:
            raise APIError(f"logprob_start_len={start} is invalid: -1 (none of the prompt) or a "
                           "prompt position", param="logprob_start_len")
        if start is not None and start >= 0 and not want:
            raise APIError("logprob_start_len needs return_logprob=true", param="logprob_start_len")
        if top and not want:
            raise APIError("top_logprobs_num needs return_logprob=true", param="top_logprobs_num")
        first = None if start is None or start < 0 or start >= len(ids) else start
        if want:
            fields["logprobs"] = True
            fields["top_logprobs"] = top
            if first is not None and first + 1 < len(ids):
                # the entry at `first` has no logprob (SGLang's null); the runtime's prompt
                # logprobs start at the next position
                fields["prompt_logprobs_start"] = first + 1
        return NativePrompt(ids, build_sampling_params(fields), rid or uuid.uuid4().hex, first)

    def lora_of(self, body: GenerateRequest, num_prompts: int) -> str | None:
        """The LoRA adapter `lora_path` names (None or "": the base model); a list names one
        per prompt, and here one for all."""
        given = body.lora_path if isinstance(body.lora_path, list) else [body.lora_path]
        if isinstance(body.lora_path, list) and len(given) != num_prompts:
            raise APIError(f"lora_path has {len(given)} entries for {num_prompts} prompts",
                           param="lora_path")
        names = {name or None for name in given}
        if len(names) > 1:
            raise APIError("the prompts of one request run under one LoRA adapter here: send "
                           "a request per adapter", param="lora_path")
        name = names.pop()
        if name is not None and name not in self.manager.loras:
            loaded = ", ".join(repr(n) for n in self.manager.loras) or "none"
            raise APIError(f"no LoRA adapter named {name!r} is loaded (loaded: {loaded}); load "
                           "it with POST /load_lora_adapter or --lora-paths", param="lora_path")
        return name

    @staticmethod
    def check_pin(params: list[SamplingParams]) -> None:
        if len(params) != 1 or params[0].n != 1:
            raise APIError("pin needs n=1 and one prompt: a pin keeps one sample's prefix",
                           param="pin")
        if params[0].stop:
            raise APIError("pin cannot be combined with stop strings (a stop string ends the "
                           "request where the pinned prefix is not defined): drop 'stop' or "
                           "'pin'", param="pin")

    # --- generate ----------------------------------------------------------------------------
    async def generate(self, body: GenerateRequest, request: Request) -> Response:
        prompts = await self.prompts(body)
        scheduling = scheduling_for(request, body, lora=self.lora_of(body, len(prompts)))
        started = time.monotonic()
        streams = await until_disconnected(request, open_streams(
            self.manager, [p.ids for p in prompts], [p.params for p in prompts],
            [p.rid for p in prompts], scheduling, pin=body.pin,
            images_list=[p.images for p in prompts]))
        runs, base = [], 0
        for p in prompts:
            runs.append(NativeRun(p, [SampleOutput() for _ in range(p.params.n)], started,
                                  base=base))
            base += p.params.n
        namespace = (scheduling.tenant, scheduling.extra_key)
        if body.stream:
            return SSEResponse(self.stream(runs, streams, body, namespace))
        await until_disconnected(request, self.collect(runs, streams))
        results = [self.result(run, i, body) for run in runs for i in range(run.prompt.params.n)]
        self.register(runs, namespace)
        single = len(runs) == 1 and runs[0].prompt.params.n == 1 and not self.batch(body)
        return JSONResponse(results[0] if single else results)

    @staticmethod
    def batch(body: GenerateRequest) -> bool:
        if body.text is not None:
            return isinstance(body.text, list)
        return any(isinstance(x, list) for x in body.input_ids or ())

    async def collect(self, runs: list[NativeRun], streams: list[PrimedStream]) -> None:
        async for i, chunk in merge_streams(streams):
            runs[i].add(chunk)
        for run in runs:
            for sample in run.samples:
                message = error_message(sample.finish_reason)
                if message is not None:
                    raise APIError(message)

    async def stream(self, runs: list[NativeRun], streams: list[PrimedStream],
                     body: GenerateRequest, namespace: Namespace) -> AsyncGenerator[bytes, None]:
        async for i, chunk in merge_streams(streams):
            runs[i].add(chunk)
            yield sse(self.result(runs[i], chunk.index, body))
        self.register(runs, namespace)
        yield SSE_DONE

    def register(self, runs: list[NativeRun], namespace: Namespace) -> None:
        """Keep each finished one-sample request's sequence for /concate_and_append_request
        (not one with images: their placeholders travel with the images only)."""
        for run in runs:
            sample = run.samples[0]
            if run.prompt.params.n == 1 and sample.finish_reason in ("stop", "length") \
                    and not run.prompt.images:
                self.registry.put(namespace, run.prompt.rid, run.prompt.ids + sample.token_ids)

    # --- output ------------------------------------------------------------------------------
    def result(self, run: NativeRun, index: int, body: GenerateRequest) -> dict[str, Any]:
        """One sample as SGLang's server shapes it (so far, while it streams)."""
        prompt, sample = run.prompt, run.samples[index]
        stop_ids = self.eos_ids | frozenset(prompt.params.stop_token_ids)
        meta: dict[str, Any] = {
            "id": prompt.rid,
            "finish_reason": finish_reason(sample.finish_reason, sample.matched_stop,
                                           sample.token_ids, stop_ids),
            "prompt_tokens": len(prompt.ids),
            "completion_tokens": len(sample.token_ids),
            "cached_tokens": run.cached_tokens,
            "e2e_latency": time.monotonic() - run.started,
            "rid": run.runtime_rid,  # the runtime's id (radixrt's /abort takes it too)
        }
        if prompt.params.logprobs:
            meta.update(self.logprob_meta(run, sample, body.return_text_in_logprobs))
        if body.pin and sample.finish_reason is not None:
            meta.update(pin_info(run.pinned, run.pin_error, run.runtime_rid))
        out: dict[str, Any] = {"text": sample.text, "output_ids": list(sample.token_ids),
                               "meta_info": meta}
        if body.stream:
            out["index"] = run.base + index
        return out

    def logprob_meta(self, run: NativeRun, sample: SampleOutput, with_text: bool) -> dict[str, Any]:
        text_of = self.token_text if with_text else None
        prompt = run.prompt
        inputs: list[TokenLogprob | None] = []
        entries: list[tuple[float | None, int]] = []
        if prompt.logprob_start is not None:
            inputs = [None, *run.prompt_logprobs]
            entries = [(None, prompt.ids[prompt.logprob_start])]
            entries += [(item.logprob, item.token_id) for item in run.prompt_logprobs]
        meta: dict[str, Any] = {
            "input_token_logprobs": logprob_triples(entries, text_of),
            "output_token_logprobs": logprob_triples(
                [(item.logprob, item.token_id) for item in sample.logprobs], text_of),
            "output_token_logprobs_length": len(sample.logprobs),
        }
        if prompt.params.top_logprobs:
            meta["input_top_logprobs"] = top_triples(inputs, text_of)
            meta["output_top_logprobs"] = top_triples(list(sample.logprobs), text_of)
        return meta

    # --- /concate_and_append_request ---------------------------------------------------------
    async def concat_and_append(self, body: ConcatAppendBody, request: Request) -> Response:
        scheduling = scheduling_for(request, body)
        namespace = (scheduling.tenant, scheduling.extra_key)
        dst = self.registry.get(namespace, body.dst_rid)
        sources = [self.registry.get(namespace, rid) for rid in body.src_rids]
        unknown = [rid for rid, seq in zip([body.dst_rid, *body.src_rids], [dst, *sources])
                   if seq is None]
        if unknown:
            raise APIError(f"unknown request id(s) {unknown}: ids are the meta_info 'id' of "
                           "finished one-sample /generate requests of this tenant, kept for "
                           "an hour at most", status=404, param="src_rids")
        assert dst is not None
        joined = list(dst)
        for rid, seq in zip(body.src_rids, sources):
            assert seq is not None
            if seq[:len(dst)] != dst:
                raise APIError(f"source {rid!r} does not continue destination "
                               f"{body.dst_rid!r}: a source must start with the destination's "
                               "tokens (a fork of it)", param="src_rids")
            joined += seq[len(dst):]
        params = SamplingParams(max_tokens=0)  # prefill only: the joined sequence's KV
        streams = await until_disconnected(request, open_streams(
            self.manager, [joined], [params], body.dst_rid, scheduling))
        run = NativeRun(NativePrompt(joined, params, body.dst_rid, None), [SampleOutput()],
                        time.monotonic())
        await until_disconnected(request, self.collect([run], streams))
        self.registry.put(namespace, body.dst_rid, joined)
        return JSONResponse({"success": True, "dst_rid": body.dst_rid,
                             "prompt_tokens": len(joined), "cached_tokens": run.cached_tokens})


def pin_info(pinned: bool, error: str | None, rid: int | None) -> dict[str, Any]:
    if pinned:
        return {"pin_id": rid}
    return {"pin_id": None, "pin_error": error or "not pinned: the request did not finish "
            "normally, or the radix cache is off (--disable-radix-cache)"}
