"""radixrt.Engine: the scheduler and the worker in one process, by direct calls.

For tests and offline batch jobs; the server runs the same classes as separate processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from radixrt.runtime.config import CPU_MAX_POOL_TOKENS, GRAMMAR_POLL_S, EngineConfig
from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.token_table import TokenTable
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.messages import OutputDelta
from radixrt.runtime.models.loader import LoadedModel, load_model
from radixrt.runtime.outputs import RequestOutput, StreamChunk
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.output_deltas import collect_deltas
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler
from radixrt.runtime.tokenizer.output_tracker import OutputTracker
from radixrt.runtime.tokenizer.prompts import (
    Prompt,
    encode_checked,
    is_single_prompt,
)
from radixrt.runtime.worker.worker import Worker


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


@dataclass
class _Deferred:
    """A submitted request waiting for its grammar to compile."""

    future: Future
    ids: list[int]
    params: SamplingParams
    extra_key: str | None
    pin: bool


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
        self._grammars: GrammarCompiler | None = None
        self._compiling: dict[int, _Deferred] = {}  # rid -> request waiting for its grammar
        self.worker = Worker(
            loaded,
            num_pages * self.config.page_size,
            seed=self.config.seed,
            cuda_graph_max_bs=self.config.cuda_graph_max_bs,
            jump_forward=not self.config.disable_jump_forward,
        )
        self.eos_token_ids = list(loaded.config.eos_token_ids)
        self.scheduler = Scheduler(self.config, num_pages, self.context_length, self.eos_token_ids)
        self._trackers: dict[int, OutputTracker] = {}
        self._queues: dict[int, asyncio.Queue] = {}  # rid -> chunks of a running stream

    # --- submission ----------------------------------------------------------------------
    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        extra_key: str | None = None,
        pin: bool = False,
    ) -> int:
        """Queue one prompt; returns its request id. Raises ValueError on bad input.
        pin=True: once it finishes, its prefix stays in the radix cache until `unpin(rid)`."""
        params = params or SamplingParams()
        params.validate_for_vocab(self.model_config.vocab_size)
        ids = encode_checked(self.tokenizer, prompt, self.model_config.vocab_size)
        constraint = params.constraint
        if constraint is None:
            rid = self.scheduler.add_request(ids, params, extra_key, pin=pin).rid
        else:  # compiled off the hot path: the request waits apart until its grammar is ready
            self.scheduler.check_limits(ids, params)
            future = self.grammars.compile_async(constraint)  # refuses a broken pattern
            rid = self.scheduler.new_rid()
            self._compiling[rid] = _Deferred(future, ids, params, extra_key, pin)
        self._trackers[rid] = OutputTracker(self.tokenizer, rid, ids, params)
        return rid

    @property
    def grammars(self) -> GrammarCompiler:
        """The compiler (and LRU cache) of constrained requests' grammars, shared with the
        worker; made on first use."""
        if self._grammars is None:
            cfg = self.model_config
            table = TokenTable(self.tokenizer, cfg.vocab_size, cfg.eos_token_ids)
            self._grammars = GrammarCompiler(table)
            self.worker.grammars = self._grammars
        return self._grammars

    def _admit_compiled(self) -> None:
        """Requests whose grammar is ready join the scheduler; a failed compile ends one."""
        for rid, deferred in list(self._compiling.items()):
            if not deferred.future.done():
                continue
            del self._compiling[rid]
            error = deferred.future.exception()
            if error is not None:
                self._end_outside(rid, f"error: the grammar failed to compile: {error}")
                continue
            self.scheduler.add_request(deferred.ids, deferred.params, deferred.extra_key,
                                       rid=rid, pin=deferred.pin)

    def _end_outside(self, rid: int, reason: str) -> None:
        """End a request the scheduler does not hold (still waiting for its grammar)."""
        tracker = self._trackers.get(rid)
        if tracker is not None:
            delta = OutputDelta(rid=rid, owner=rid, index=-1, token_ids=[], finish_reason=reason)
            self._deliver(tracker.apply(delta)[0])

    def unpin(self, rid: int) -> bool:
        """Let the radix cache evict the prefix a pinned request kept; False if none was kept."""
        return self.scheduler.unpin(rid)

    def abort(self, rid: int) -> None:
        """Abort a request (and all its samples) wherever it is."""
        if self._compiling.pop(rid, None) is not None:
            self._end_outside(rid, "abort")
            return
        chunks = self._emit(self.scheduler.abort(rid))
        self._deliver(chunks)

    # --- stepping ------------------------------------------------------------------------
    def step(self) -> list[StreamChunk]:
        """Run one scheduling step (one forward pass); returns the new output pieces."""
        self._admit_compiled()
        plan = self.scheduler.schedule()
        if plan is None:
            touched = self.scheduler.take_finished_outside_step()
            if not touched and self._compiling:  # only grammars to wait for
                futures_wait([d.future for d in self._compiling.values()],
                             timeout=GRAMMAR_POLL_S, return_when=FIRST_COMPLETED)
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
        for delta in collect_deltas(self.scheduler, touched):
            tracker = self._trackers.get(delta.owner)
            if tracker is None:
                continue
            new, stopped = tracker.apply(delta)
            chunks += new
            if stopped:  # a stop string: end it here and on the scheduler side
                self.scheduler.finish(delta.rid, "stop")
                collect_deltas(self.scheduler, [self.scheduler.requests[delta.rid]])
        return chunks

    def _deliver(self, chunks: list[StreamChunk]) -> None:
        for chunk in chunks:
            queue = self._queues.get(chunk.rid)
            if queue is not None:
                queue.put_nowait(chunk)

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
        while not all(self._trackers[rid].finished for rid in rids):
            self.step()
        return [self._trackers.pop(rid).output for rid in rids]

    async def generate_stream(
        self, prompt: Prompt, params: SamplingParams | None = None, pin: bool = False
    ) -> AsyncIterator[StreamChunk]:
        """Yield text as it is generated. Several streams may run at once in one event loop:
        whichever is waiting drives the engine's steps."""
        rid = self.submit(prompt, params, pin=pin)
        tracker = self._trackers[rid]
        queue: asyncio.Queue[StreamChunk] = asyncio.Queue()
        self._queues[rid] = queue
        try:
            while True:
                while queue.empty() and not tracker.finished:
                    self.step()
                    await asyncio.sleep(0)
                while not queue.empty():
                    yield queue.get_nowait()
                if tracker.finished:
                    return
        finally:
            if not tracker.finished:
                self.abort(rid)
            self._trackers.pop(rid, None)
            self._queues.pop(rid, None)

    # --- introspection -------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise RuntimeError on any KV leak, double free or miscount."""
        self.scheduler.check_integrity()

    def flush_cache(self) -> int:
        return self.scheduler.kv.flush()

    def stats(self) -> dict[str, Any]:
        """Pool counters (tokens), cache hit rate, steps, preemptions."""
        return self.scheduler.stats_dict()
