"""radixrt.Engine: the scheduler and the worker in one process, by direct calls.

For tests and offline batch jobs; the server runs the same classes as separate processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch

from radixrt.runtime.config import CPU_MAX_POOL_TOKENS, EngineConfig
from radixrt.runtime.models.loader import LoadedModel, load_model
from radixrt.runtime.outputs import CompletionOutput, RequestOutput, StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler
from radixrt.runtime.tokenizer.detokenizer import IncrementalDetokenizer
from radixrt.runtime.tokenizer.prompts import (
    Prompt,
    check_token_ids,
    encode_prompt,
    is_single_prompt,
)
from radixrt.runtime.worker.kv_cache import KVCache
from radixrt.runtime.worker.worker import Worker


@dataclass
class _Sample:
    detok: IncrementalDetokenizer
    out: CompletionOutput
    seen: int = 0  # output tokens already passed on


@dataclass
class _Tracker:
    output: RequestOutput
    params: SamplingParams
    samples: dict[int, _Sample] = field(default_factory=dict)  # by scheduler rid
    queue: asyncio.Queue | None = None


def resolve_device_dtype(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    name = config.dtype
    if name == "auto":
        name = "bfloat16" if dev.type == "cuda" else "float32"
    return dev, getattr(torch, name)


def pool_pages(config: EngineConfig, bytes_per_token: int, device: torch.device) -> int:
    """KV pool size: an explicit max_total_tokens, or mem_fraction of free memory."""
    if config.max_total_tokens is not None:
        tokens = config.max_total_tokens
    else:
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
        else:
            free = psutil.virtual_memory().available
        tokens = int(free * config.mem_fraction) // bytes_per_token
        if device.type == "cpu":
            tokens = min(tokens, CPU_MAX_POOL_TOKENS)
    return max(tokens // config.page_size, 2)


class Engine:
    """Generate from prompts with the radix cache, continuous batching and chunked prefill.

    >>> engine = Engine()  # the default model; Engine(model=path, page_size=16, ...)
    >>> engine.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))
    """

    def __init__(self, model: str | LoadedModel | None = None, **options: Any) -> None:
        """model: "default", a .gguf file, a checkpoint folder, or an already LoadedModel (to
        share weights between engines, as the tests do); options: EngineConfig fields."""
        loaded = model if isinstance(model, LoadedModel) else None
        if loaded is not None:
            options["model"] = loaded.model_path
        elif model is not None:
            options["model"] = model
        self.config = EngineConfig.from_kwargs(**options)
        device, dtype = resolve_device_dtype(self.config)
        if loaded is not None:
            param = next(loaded.model.parameters())
            device, dtype = param.device, param.dtype
        else:
            backend = self.config.attention_backend
            if backend == "auto":
                backend = "triton" if device.type == "cuda" else "torch"
            loaded = load_model(
                self.config.model,
                dtype=dtype,
                device=device,
                load_format=self.config.load_format,
                attention_backend=backend,
            )
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.context_length = self.config.context_length or loaded.config.max_position_embeddings
        per_token = KVCache.bytes_per_token_for(loaded.config, dtype)
        num_pages = pool_pages(self.config, per_token, device)
        self.worker = Worker(loaded, num_pages * self.config.page_size, seed=self.config.seed)
        self.eos_token_ids = list(loaded.config.eos_token_ids)
        self.scheduler = Scheduler(self.config, num_pages, self.context_length, self.eos_token_ids)
        self._trackers: dict[int, _Tracker] = {}
        self._owner: dict[int, int] = {}  # scheduler rid of a sample -> tracker rid

    # --- submission ----------------------------------------------------------------------
    def submit(
        self, prompt: Prompt, params: SamplingParams | None = None, extra_key: str | None = None
    ) -> int:
        """Queue one prompt; returns its request id. Raises ValueError on bad input."""
        params = params or SamplingParams()
        params.validate_for_vocab(self.model_config.vocab_size)
        ids = encode_prompt(self.tokenizer, prompt)
        check_token_ids(ids, self.model_config.vocab_size)
        req = self.scheduler.add_request(ids, params, extra_key)
        output = RequestOutput(rid=req.rid, prompt_token_ids=ids, samples=[])
        tracker = _Tracker(output=output, params=params)
        self._trackers[req.rid] = tracker
        if params.n == 1:
            self._add_sample(tracker, req.rid, 0, ids)
        else:
            output.samples = [CompletionOutput(index=i) for i in range(params.n)]
        return req.rid

    def _add_sample(self, tracker: _Tracker, rid: int, index: int, prompt_ids: list[int]) -> None:
        params = tracker.params
        detok = IncrementalDetokenizer(
            self.tokenizer, prompt_ids, params.skip_special_tokens, params.stop
        )
        out = CompletionOutput(index=index)
        if len(tracker.output.samples) > index:
            tracker.output.samples[index] = out
        else:
            tracker.output.samples.append(out)
        tracker.samples[rid] = _Sample(detok=detok, out=out)
        self._owner[rid] = tracker.output.rid

    def abort(self, rid: int) -> None:
        """Abort a request (and all its samples) wherever it is."""
        chunks = self._emit(self.scheduler.abort(rid))
        self._deliver(chunks)

    # --- stepping ------------------------------------------------------------------------
    def step(self) -> list[StreamChunk]:
        """Run one scheduling step (one forward pass); returns the new output pieces."""
        plan = self.scheduler.schedule()
        if plan is None:
            touched = self.scheduler.take_finished_outside_step()
        else:
            result = self.worker.execute(plan)
            touched = self.scheduler.process_results(plan, result)
        if self.config.check_integrity:
            self.check_integrity()
        chunks = self._emit(touched)
        self._deliver(chunks)
        return chunks

    def _emit(self, touched: Sequence[Request]) -> list[StreamChunk]:
        chunks: list[StreamChunk] = []
        for req in touched:
            if req.finish_reason == "forked":
                tracker = self._trackers[req.rid]
                tracker.output.prompt_logprobs = list(req.prompt_logprobs)
                tracker.output.cached_tokens = req.cached_len
                for i, child in enumerate(self.scheduler.children.get(req.rid, [])):
                    self._add_sample(tracker, child, i, req.prompt_ids)
                continue
            owner = self._owner.get(req.rid)
            if owner is None:
                if req.finished and req.rid in self._trackers:  # n > 1, ended before forking
                    chunks += self._end_unforked(self._trackers[req.rid], req)
                continue
            tracker = self._trackers[owner]
            sample = tracker.samples[req.rid]
            if req.parent_rid is None:
                tracker.output.cached_tokens = req.cached_len
                tracker.output.prompt_logprobs = list(req.prompt_logprobs)
            chunk = self._advance(tracker, sample, req)
            if chunk is not None:
                chunks.append(chunk)
        return chunks

    def _advance(self, tracker: _Tracker, sample: _Sample, req: Request) -> StreamChunk | None:
        new_ids = req.output_ids[sample.seen :]
        new_lps = req.output_logprobs[sample.seen :] if tracker.params.wants_logprobs else []
        sample.seen = len(req.output_ids)
        text = sample.detok.add(new_ids) if new_ids else ""
        if sample.detok.stopped and not req.finished:
            self.scheduler.finish(req.rid, "stop")
        if req.finished:
            text += sample.detok.finish()
        out = sample.out
        out.token_ids.extend(new_ids)
        out.logprobs.extend(new_lps)
        out.text += text
        if req.finished:
            out.finish_reason = req.finish_reason
            self.scheduler.forget(req.rid)
            if tracker.output.finished:
                self.scheduler.forget(tracker.output.rid)
                for rid in tracker.samples:
                    self._owner.pop(rid, None)
        if not (new_ids or req.finished):
            return None
        return StreamChunk(
            rid=tracker.output.rid,
            index=out.index,
            text=text,
            token_ids=new_ids,
            finish_reason=out.finish_reason,
            logprobs=list(new_lps),
        )

    def _end_unforked(self, tracker: _Tracker, req: Request) -> list[StreamChunk]:
        self.scheduler.forget(req.rid)
        for out in tracker.output.samples:
            out.finish_reason = req.finish_reason
        return [
            StreamChunk(req.rid, o.index, "", [], o.finish_reason) for o in tracker.output.samples
        ]

    def _deliver(self, chunks: list[StreamChunk]) -> None:
        for chunk in chunks:
            tracker = self._trackers.get(chunk.rid)
            if tracker is not None and tracker.queue is not None:
                tracker.queue.put_nowait(chunk)

    # --- blocking and streaming APIs -----------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or a list of prompts; returns one output per prompt."""
        batch = [prompts] if is_single_prompt(prompts) else list(prompts)  # type: ignore[list-item]
        if params is None or isinstance(params, SamplingParams):
            params_list = [params or SamplingParams()] * len(batch)
        else:
            params_list = list(params)
            if len(params_list) != len(batch):
                raise ValueError(f"{len(batch)} prompts but {len(params_list)} SamplingParams")
        rids: list[int] = []
        try:
            for prompt, p in zip(batch, params_list):
                rids.append(self.submit(prompt, p))
        except Exception:
            for rid in rids:
                self.abort(rid)
                self._trackers.pop(rid, None)
            raise
        while not all(self._trackers[rid].output.finished for rid in rids):
            self.step()
        return [self._trackers.pop(rid).output for rid in rids]

    async def generate_stream(
        self, prompt: Prompt, params: SamplingParams | None = None
    ) -> AsyncIterator[StreamChunk]:
        """Yield text as it is generated. Several streams may run at once in one event loop:
        whichever is waiting drives the engine's steps."""
        rid = self.submit(prompt, params)
        tracker = self._trackers[rid]
        tracker.queue = asyncio.Queue()
        try:
            while True:
                while tracker.queue.empty() and not tracker.output.finished:
                    self.step()
                    await asyncio.sleep(0)
                while not tracker.queue.empty():
                    yield tracker.queue.get_nowait()
                if tracker.output.finished:
                    return
        finally:
            if not tracker.output.finished:
                self.abort(rid)
            self._trackers.pop(rid, None)

    # --- introspection -------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise RuntimeError on any KV leak, double free or miscount."""
        self.scheduler.check_integrity()

    def flush_cache(self) -> int:
        return self.scheduler.kv.flush()

    def stats(self) -> dict[str, Any]:
        s = self.scheduler.stats
        counters = self.scheduler.kv.counters(self.scheduler.running)
        return {
            "kv_total": counters.total,
            "kv_free": counters.free,
            "kv_evictable": counters.evictable,
            "kv_locked": counters.locked,
            "kv_private": counters.private,
            "page_size": self.config.page_size,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "swapped": len(self.scheduler.swapped),
            "steps": s.steps,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "cache_hit_rate": s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0,
            "computed_tokens": s.computed_tokens,
            "generated_tokens": s.generated_tokens,
            "preemptions": s.preemptions,
            "swaps": s.swaps,
        }
