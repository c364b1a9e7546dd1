"""radixrt.Engine: the scheduler and the worker in one process, by direct calls.

For tests and offline batch jobs; the server runs the same classes as separate processes.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as futures_wait
from typing import Any

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.constrained.token_table import TokenTable
from radixrt.runtime.engine_link import EngineLink
from radixrt.runtime.messages import Scheduling, ToScheduler, ToTokenizer
from radixrt.runtime.models.loader import LoadedModel
from radixrt.runtime.outputs import RequestOutput, StreamChunk
from radixrt.runtime.pooling_params import PoolingInfo
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.intake import SchedulerIntake
from radixrt.runtime.scheduler.loop import StepLoop
from radixrt.runtime.scheduler.scheduler import Scheduler
from radixrt.runtime.tokenizer.image_refs import local_image
from radixrt.runtime.tokenizer.pooling_inputs import (
    class_probs,
    embed_params,
    encode_inputs,
    pooled_result,
    rerank_ids,
    rerank_score,
    score_params,
)
from radixrt.runtime.tokenizer.prompts import Prompt, is_single_prompt
from radixrt.runtime.tokenizer.request_front import RequestFront, refusal_error
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager
from radixrt.runtime.worker.setup import build_worker
from radixrt.runtime.worker.step_executor import InlineExecutor, ThreadExecutor
from radixrt.runtime.worker.tp_ranks import EngineRanks

GRAMMAR_POLL_S = 0.05  # an Engine with only grammars compiling waits this long per step


class Engine:
    """Generate from prompts with the radix cache, continuous batching and chunked prefill.

    >>> engine = Engine()  # the default model; Engine(model=path, page_size=16, ...)
    >>> engine.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))
    """

    def __init__(
        self, model: str | LoadedModel | None = None, overlap: bool = False, **options: Any
    ) -> None:
        """model: "default", a .gguf file, a checkpoint folder, or an already LoadedModel (to
        share weights between engines, as the tests do); overlap: run the worker on its own
        thread and plan step t+1 while it computes step t, as the server does (outputs are the
        same either way); options: EngineConfig fields. With tp_size > 1 this process is
        rank 0 of a tensor-parallel group whose other ranks it starts as processes (call
        close() to stop them; each rank loads its shard, so `model` is then a path)."""
        loaded = model if isinstance(model, LoadedModel) else None
        if loaded is not None:
            options["model"] = loaded.model_path
        elif model is not None:
            options["model"] = model
        self.config = EngineConfig.from_kwargs(**options)
        self._ranks: EngineRanks | None = None
        self._closed = False
        # compiled grammars, for when the cache has evicted one a queued request still needs
        # (the worker loads it, never compiles it inside a step) and for the other ranks
        self._grammar_dir = tempfile.TemporaryDirectory(prefix="radixrt-grammars-",
                                                        ignore_cleanup_errors=True)
        if self.config.node_rank > 0:
            raise ValueError(f"node_rank={self.config.node_rank}: an Engine is node 0 (rank 0 "
                             "and its node's ranks); run the other nodes' ranks with "
                             "`radixrt serve --node-rank K`")
        if self.config.tp_size > 1:
            if loaded is not None:
                raise ValueError("tp_size > 1 loads each rank's shard: pass the model's path, "
                                 "not a LoadedModel")
            self._ranks = EngineRanks(self.config, grammar_dir=self._grammar_dir.name)
        try:
            self.worker, ready = build_worker(
                self.config, loaded, tp=None if self._ranks is None else self._ranks.group)
        except BaseException:
            if self._ranks is not None:
                self._ranks.close()
            raise
        runner = self.worker if self._ranks is None else self._ranks.lead(self.worker)
        self.tp_layout = ready.tp
        self.model_config = self.worker.config
        self.tokenizer = self.worker.tokenizer
        self.context_length = ready.context_length
        self.eos_token_ids = list(ready.eos_token_ids)
        self.scheduler = Scheduler.for_worker(self.config, ready)
        self._executor: InlineExecutor | ThreadExecutor = (
            ThreadExecutor(runner) if overlap else InlineExecutor(runner)
        )
        self.loop = StepLoop(self.scheduler, self._executor, overlap,
                             self.config.check_integrity)
        self.intake = SchedulerIntake(self.scheduler, ready)
        self._grammars: GrammarCompiler | None = None
        self.front = RequestFront(self.tokenizer, self._to_scheduler, lambda: self.grammars,
                                  processor=self.worker.processor)
        self.link = EngineLink(self)  # generate_stream's steps, and any TokenizerManager's

    # --- the scheduler's side, by direct calls (EngineLink drives the same two) -----------
    def handle(self, msg: ToScheduler) -> list[ToTokenizer]:
        """One message from a request front, as the scheduler process takes it."""
        return self.intake.handle(msg)

    def advance(self) -> list[ToTokenizer]:
        """One turn of the step loop (one forward pass); the outputs it caused."""
        return self.intake.deltas(self.loop.step())

    def _to_scheduler(self, msg: ToScheduler) -> None:
        for reply in self.handle(msg):
            self._from_scheduler(reply)

    def _from_scheduler(self, reply: ToTokenizer) -> list[StreamChunk]:
        return self.front.receive(reply)

    # --- submission ----------------------------------------------------------------------
    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        extra_key: str | None = None,
        pin: bool = False,
        priority: int = 0,
        tenant: str = "",
        timeout: float | None = None,
        lora: str | None = None,
        images: Sequence[Any] = (),
    ) -> int:
        """Queue one prompt; returns its request id. Raises ValueError on bad input, QueueFull
        past max_queued_requests / max_queued_per_tenant (requests whose grammar is compiling
        count as queued).
        pin=True: once it finishes, its prefix stays in the radix cache until `unpin(rid)`.
        extra_key: the radix cache's namespace (requests with different keys share nothing);
        priority: lower is more urgent (default 0); tenant: whose request it is (fair share);
        timeout: seconds it may wait in the queue before it ends with an error; lora: the name
        of a LoRA adapter to run under (load_lora, or lora_paths). A vision-language model
        takes images: as chat messages' image parts (`{"type": "image", "image": ...}`, or
        OpenAI's image_url parts), or `images` for a text prompt that writes the model's image
        token once per image; each a PIL image, bytes, a data: / http(s) URL or a path."""
        scheduling = Scheduling(priority=priority, tenant=tenant, extra_key=extra_key,
                                timeout_s=timeout, lora=lora)
        ids, shown = self.front.encode_images(prompt, images, load=local_image)
        rid = self.front.submit(ids, params or SamplingParams(), scheduling, pin, images=shown)
        refusal = self.front.refusal(rid)
        if refusal is not None:
            raise refusal_error(refusal)
        return rid

    @property
    def grammars(self) -> GrammarCompiler:
        """The compiler (and LRU cache) of constrained requests' grammars, shared with the
        worker; made on first use."""
        if self._grammars is None:
            cfg = self.model_config
            table = TokenTable(self.tokenizer, cfg.vocab_size, cfg.eos_token_ids)
            self._grammars = GrammarCompiler(table, self._grammar_dir.name,
                                             backend=self.config.grammar_backend,
                                             timeout_s=self.config.grammar_compile_timeout)
            self.worker.grammars = self._grammars
        return self._grammars

    def take_output(self, rid: int) -> RequestOutput | None:
        """The output of a request from submit(), once it has finished (the Engine then forgets
        it: take each once); None while it still runs. KeyError: unknown, or taken already."""
        tracker = self.front.tracker(rid)
        if tracker is None or self.front.stream(rid) is not None:  # a stream owns its own
            raise KeyError(f"request {rid} is unknown to this Engine, or its output was taken")
        if not tracker.finished:
            return None
        return self.front.take(rid)

    def take_finished(self) -> list[RequestOutput]:
        """The outputs of every submitted request that has finished since the last call (each
        once; requests streamed by generate_stream are not among them). An Engine driven by
        submit() and step() holds each output until it is taken."""
        done = [rid for rid in self.front.held
                if self.front.finished(rid) and self.front.stream(rid) is None]
        return [self.front.take(rid) for rid in done]

    # --- LoRA adapters ----------------------------------------------------------------------
    def load_lora(self, name: str, path: str) -> dict[str, Any]:
        """Serve the LoRA adapter in folder `path` (PEFT's format) as `name` (the Engine needs
        lora_paths or enable_lora=True); returns its description. ValueError says what is
        wrong with it."""
        result = self.front.call_lora(name, path).result()
        if not result["ok"]:
            raise ValueError(result["error"])
        return dict(result["adapter"])

    def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name`: requests already under it finish with it, then its
        weights and cached KV go. KeyError when no adapter has that name."""
        result = self.front.call_lora(name, None).result()
        if not result["ok"]:
            raise KeyError(result["error"])

    def lora_adapters(self) -> list[dict[str, Any]]:
        """The adapters served: name, path, rank, modules, digest."""
        return self.scheduler.lora.listing()

    def unpin(self, rid: int) -> bool:
        """Let the radix cache evict the prefix a pinned request kept; False if none was kept."""
        return self.scheduler.unpin(rid)

    def abort(self, rid: int) -> None:
        """Abort a request (and all its samples) wherever it is."""
        self.front.abort(rid)

    # --- stepping ------------------------------------------------------------------------
    def step(self) -> list[StreamChunk]:
        """Run one turn of the step loop (one forward pass); returns the new output pieces."""
        self.front.poll()
        replies = self.advance()
        compiling = self.front.compiling
        if not replies and not self.loop.in_flight and compiling:  # only grammars to wait for
            futures_wait(compiling, timeout=GRAMMAR_POLL_S, return_when=FIRST_COMPLETED)
        return [chunk for reply in replies for chunk in self._from_scheduler(reply)]

    # --- blocking and streaming APIs -----------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: int = 0,
        tenant: str = "",
        lora: str | None | Sequence[str | None] = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or a list of prompts; returns one output per prompt. lora:
        a LoRA adapter's name for every prompt, or one per prompt (None: the base model); the
        prompts of different adapters run in the same forward passes."""
        batch = [prompts] if is_single_prompt(prompts) else list(prompts)  # type: ignore[list-item]
        if params is None or isinstance(params, SamplingParams):
            params_list = [params or SamplingParams()] * len(batch)
        else:
            params_list = list(params)
            if len(params_list) != len(batch):
                raise ValueError(f"{len(batch)} prompts but {len(params_list)} SamplingParams")
        loras = [lora] * len(batch) if lora is None or isinstance(lora, str) else list(lora)
        if len(loras) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(loras)} LoRA adapter names")
        rids: list[int] = []
        try:
            for prompt, p, adapter in zip(batch, params_list, loras):
                rids.append(self.submit(prompt, p, priority=priority, tenant=tenant,
                                        lora=adapter))
        except Exception:
            for rid in rids:
                self.abort(rid)
                self.front.forget(rid)
            raise
        while not all(self.front.finished(rid) for rid in rids):
            self.step()
        return [self.front.take(rid) for rid in rids]

    # --- pooling: embeddings and scores (tokenizer/pooling_inputs.py) ---------------------
    @property
    def pooling(self) -> PoolingInfo:
        """What pooling requests the model serves (its pooling, head, task)."""
        assert self.scheduler.pooling is not None
        return self.scheduler.pooling

    def embed(self, inputs: Prompt | Sequence[Prompt], dimensions: int | None = None,
              normalize: bool | None = None) -> list[list[float]]:
        """One embedding per input (text or token ids): the model's pooling of its final
        hidden states, cut to `dimensions`, unit length unless normalize=False (the default is
        the checkpoint's)."""
        return self._pool(inputs, embed_params(self.pooling, dimensions, normalize))

    def rerank(self, query: str, documents: Sequence[str],
               instruction: str | None = None) -> list[float]:
        """Each document's relevance to the query in [0, 1], in the documents' order (a
        cross-encoder, or a language model served with task="rerank")."""
        ids = rerank_ids(self.tokenizer, self.pooling, query, documents, instruction)
        return [rerank_score(self.pooling, logits)
                for logits in self._pool(ids, score_params(self.pooling))]

    def classify(self, inputs: Prompt | Sequence[Prompt]) -> list[list[float]]:
        """Per input, the classification head's probabilities over its labels
        (`pooling.labels`; a head of one label: its sigmoid)."""
        return [class_probs(logits)
                for logits in self._pool(inputs, score_params(self.pooling))]

    def reward(self, inputs: Prompt | Sequence[Prompt]) -> list[float]:
        """Per input, a reward model's score: the raw logit of its one-label head."""
        if self.pooling.num_labels != 1:
            raise ValueError(f"reward reads a head of one label; this model has "
                             f"{self.pooling.num_labels} (use classify)")
        return [logits[0] for logits in self._pool(inputs, score_params(self.pooling))]

    def _pool(self, inputs: Prompt | Sequence[Prompt],
              params: SamplingParams) -> list[list[float]]:
        """Run pooling requests, bounded as over HTTP; each one's vector or logits, or
        ValueError naming the input that ended without (PoolingAborted if aborted)."""
        outs = self.generate(encode_inputs(self.front.encode, inputs), params)
        return [pooled_result(out.pooled, out.finish_reason, i) for i, out in enumerate(outs)]

    async def generate_stream(
        self, prompt: Prompt, params: SamplingParams | None = None, pin: bool = False,
        priority: int = 0, tenant: str = "", timeout: float | None = None,
        extra_key: str | None = None, lora: str | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """Yield text as it is generated. Several streams may run at once in one event loop:
        whichever is waiting drives the engine's steps, on the event loop's thread (a step
        blocks the loop while it runs; with overlap=True the forward pass itself runs on the
        worker thread, but planning and folding still run here). With pin, the final chunk says
        whether the prefix was pinned; a stream closed before that chunk was taken unpins it."""
        scheduling = Scheduling(priority=priority, tenant=tenant, extra_key=extra_key,
                                timeout_s=timeout, lora=lora)
        ids, shown = self.front.encode_images(prompt, load=local_image)
        rid = self.front.submit(ids, params or SamplingParams(), scheduling, pin, stream=True,
                                images=shown)
        handed = False  # the chunk that hands the pin over was taken
        try:
            async for chunk in self.front.read(rid, self.link.progress):
                handed = handed or chunk.pinned
                yield chunk
        finally:
            if not self.front.finished(rid):
                self.abort(rid)
            if pin and not handed:
                self.unpin(rid)  # nobody took the pin over (a no-op when nothing was pinned)
            self.front.forget(rid)

    def tokenizer_manager(self, model_name: str = "default") -> TokenizerManager:
        """A TokenizerManager over this Engine: serve it over HTTP and the DSL socket in one
        process (`create_app(engine.tokenizer_manager())`), as the tests do."""
        return TokenizerManager(self.link, model_name)

    def close(self) -> None:
        """Stop the worker thread of an overlapping Engine (an inline one holds none), the
        worker's mask thread and the other tensor-parallel ranks. The Engine takes no more
        steps after this. With a disk KV tier, the cache goes to it first (a warm restart).
        Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self.loop.persist_cache()
        finally:
            self._executor.close()
            try:
                self.worker.close()
            finally:
                if self._ranks is not None:
                    self._ranks.close()
                    self._ranks = None
                if self._grammars is not None:
                    self._grammars.close()
                    self._grammars = None
                self._grammar_dir.cleanup()

    # --- introspection -------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise RuntimeError on any KV leak, double free or miscount."""
        self.scheduler.check_integrity()

    def flush_cache(self) -> int:
        return self.scheduler.flush_cache()

    def stats(self) -> dict[str, Any]:
        """Pool counters (tokens), cache hit rate, steps, preemptions; outputs_held: the
        submitted requests whose outputs the Engine still holds (running, or finished and not
        taken yet)."""
        return {**self.scheduler.stats_dict(), "outputs_held": len(self.front.held)}
