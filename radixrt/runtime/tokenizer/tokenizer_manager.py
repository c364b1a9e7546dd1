"""The TokenizerManager: what the HTTP and DSL endpoints call, on an event loop.

It is the request front (request_front.py) made asynchronous, over a link to the scheduler:
`ZmqSchedulerLink` (tokenizer/zmq_link.py: `radixrt serve`'s tokenizer process, the scheduler a
process of its own) or `EngineLink` (runtime/engine_link.py: an in-process Engine, for tests and
embedding). Either way a request takes the same path: encoded and submitted by the front,
its grammar compiled off the loop, its output streamed from the front's Stream; the endpoints
above are written once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from radixrt.runtime.errors import QueueFull
from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.messages import Scheduling
from radixrt.runtime.models.lora_format import adapter_key
from radixrt.runtime.outputs import StreamChunk
from radixrt.runtime.pooling_params import PoolingInfo
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.decoded_images import DecodedImages
from radixrt.runtime.tokenizer.media_fetch import MediaPolicy
from radixrt.runtime.tokenizer.prompts import Prompt
from radixrt.runtime.tokenizer.request_front import RequestFront, Stream
from radixrt.runtime.tokenizer.request_images import load_request_images
from radixrt.runtime.tokenizer.request_metrics import RequestMetrics
from radixrt.runtime.tokenizer.request_tracer import RequestTracer
from radixrt.runtime.tree_messages import TEXT_HEAD_TOKENS, TreeView

if TYPE_CHECKING:
    from PIL import Image

TREE_VIEW_MAX_AGE_S = 1.0  # radix_tree: one snapshot per question this often at most
TREE_VIEW_INTERVAL_S = 0.25  # ... and any two snapshots this far apart


class SchedulerLink(Protocol):
    """How a TokenizerManager reaches the scheduler."""

    front: RequestFront  # its `send` reaches the scheduler; the link feeds its `receive`
    info: dict[str, Any]  # the scheduler's info (SchedulerIntake.info) once started

    async def start(self, alive: Callable[[], bool], timeout_s: float) -> None:
        """Return once the scheduler is ready (RuntimeError if `alive()` turns False,
        TimeoutError after timeout_s)."""
        ...

    async def progress(self, stream: Stream) -> None:
        """Return once `stream` may have new items (the Engine takes a step to get them)."""
        ...

    async def close(self) -> None: ...


class ClientIds:
    """The ids clients see (`cmpl-...`, `chatcmpl-...`, `gen-...`, given to `generate` as
    rid_hint) -> the runtime ids of their running requests (one per prompt of a request), so
    that /abort takes either."""

    def __init__(self) -> None:
        self._rids: dict[str, set[int]] = {}

    def add(self, hint: str | None, rid: int) -> None:
        if hint is not None:
            self._rids.setdefault(hint, set()).add(rid)

    def remove(self, hint: str | None, rid: int) -> None:
        rids = self._rids.get(hint) if hint is not None else None
        if rids is not None:
            rids.discard(rid)
            if not rids:
                del self._rids[hint]  # type: ignore[arg-type]

    def resolve(self, rid: int | str) -> list[int]:
        """The runtime ids a client's id stands for (an int is one already)."""
        if isinstance(rid, int):
            return [rid]
        return sorted(self._rids.get(rid, ()))


class TokenizerManager:
    def __init__(self, link: SchedulerLink, model_name: str = "default",
                 media: MediaPolicy | None = None) -> None:
        """model_name: the name clients must send as `model`; media: what requests' image
        URLs may fetch or read (the server's --allowed-media-domains, ...; default: public
        hosts and data: URLs only)."""
        self.link = link
        self.media = media if media is not None else MediaPolicy()
        self.decoded = DecodedImages()  # requests' decoded images, bounded across requests
        self.front = link.front
        self.model_name = model_name
        self.tokenizer = link.front.tokenizer
        self._client_ids = ClientIds()
        self._callbacks: list[Callable[[RequestMetrics], None]] = []
        self._pin_callbacks: list[Callable[[int], None]] = []
        self._loras: dict[str, dict[str, Any]] | None = None  # name -> the scheduler's listing
        self.tracer: RequestTracer | None = None  # trace_with
        # (depth, limit, show_text) -> (when asked, the snapshot): radix_tree
        self._tree_views: dict[tuple[int, int, bool], tuple[float, asyncio.Future]] = {}
        self._tree_turn = asyncio.Lock()  # one snapshot at a time ...
        self._last_tree_view = -TREE_VIEW_INTERVAL_S  # ... this far apart (monotonic s)

    @property
    def context_length(self) -> int:
        return int(self.link.info["context_length"])

    @property
    def vocab_size(self) -> int:
        return int(self.link.info["vocab_size"])

    @property
    def pooling(self) -> PoolingInfo:
        """What pooling requests the model serves (WorkerReady.pooling)."""
        return msgspec.convert(self.link.info["pooling"], PoolingInfo)

    async def wait_ready(self, alive: Callable[[], bool], timeout_s: float) -> None:
        """Wait for the scheduler (which waits for the worker's model load)."""
        await self.link.start(alive, timeout_s)

    async def close(self) -> None:
        await self.link.close()

    # --- requests ------------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        """Text, token ids or chat messages -> token ids. Raises ValueError on bad input."""
        return self.front.encode(prompt)

    @property
    def takes_images(self) -> bool:
        """Is the model a vision-language model (its processor loaded)?"""
        return self.front.images is not None

    async def load_images(self, refs: Sequence[Any]) -> list[Image.Image]:
        """A request's image references -> PIL images, fetched and decoded off the event loop
        under `media` (request_images.py), held in `decoded` while they live. ValueError for
        too many or a bad one; QueueFull when other requests' decoded images leave no room."""
        return await load_request_images(refs, self.media, self.decoded)

    async def encode_images(self, prompt: Prompt, images: Sequence[Any]
                            ) -> tuple[list[int], list[ImageInput]]:
        """A prompt with its images (loaded: `load_images`) -> token ids with the images'
        placeholders, and the images for `generate` (RequestFront.encode_images), on a thread:
        the processor's resizing does not hold up the event loop's other requests."""
        return await asyncio.to_thread(self.front.encode_images, prompt, images)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        rid_hint: str | None = None,
        pin: bool = False,
        scheduling: Scheduling | None = None,
        images: Sequence[ImageInput] = (),
    ) -> AsyncIterator[StreamChunk]:
        """Submit and stream, with `scheduling`'s priority, tenant, cache namespace and queue
        timeout. With pin, the finished prompt stays cached until `unpin(rid)` when the final
        chunk says `pinned` (else its `pin_error` says why not); the on_pinned callbacks hear
        of the pin even when the stream was closed before that chunk.
        Raises QueueFull when a queue is at its cap, ValueError (both before yielding
        anything) when the runtime refuses the request: prompt or max_tokens past the
        context, ids outside the vocabulary, bad params, a grammar that does not compile.
        Closing the iterator early (client gone) aborts the request and frees its KV. Every
        sample ends with a chunk whose finish_reason is set. images: the prompt's
        (encode_images), whose placeholders are in prompt_ids."""
        scheduling = scheduling or Scheduling()
        front = self.front
        trace_context = self.tracer.context() if self.tracer is not None else None
        if trace_context is not None:
            scheduling = msgspec.structs.replace(scheduling, trace=True)
        arrival, wall_arrival = time.monotonic(), time.time()  # before the scheduler hears
        rid = front.submit(prompt_ids, params, scheduling, pin, stream=True,
                           on_pinned=self._pinned, images=images)
        self._client_ids.add(rid_hint, rid)
        metrics = RequestMetrics(arrival=arrival, prompt_tokens=len(prompt_ids),
                                 priority=scheduling.priority, tenant=scheduling.tenant,
                                 lora=scheduling.lora or "",
                                 pooling=params.pooling.task if params.pooling else "",
                                 rid=rid, wall_arrival=wall_arrival,
                                 trace_context=trace_context)
        refused = False
        try:
            grammar = front.grammar(rid)
            if grammar is not None:  # queued meanwhile; a failed compile ends it (front.poll)
                try:
                    await asyncio.wrap_future(grammar)
                finally:
                    front.poll()
            async for chunk in front.read(rid, self.link.progress):
                metrics.record(chunk, time.monotonic())
                yield chunk
        except (ValueError, QueueFull):  # its grammar, or the scheduler, refused it
            refused = True
            raise
        finally:
            self._client_ids.remove(rid_hint, rid)
            metrics.grammar = front.grammar_timing(rid)
            if not front.finished(rid):
                front.abort(rid)  # the client went away: free its KV
            front.forget(rid)
            metrics.finished = time.monotonic()
            if not refused:  # refused requests are not in the latency figures
                for callback in self._callbacks:
                    callback(metrics)

    async def abort(self, rid: int | str) -> int:
        """Abort by the runtime's id or by the id the client saw (`cmpl-...`); returns how many
        running requests that id named."""
        rids = self._client_ids.resolve(rid)
        for one in rids:
            self.front.abort(one)
        return len(rids)

    async def abort_all(self) -> int:
        """Abort every running request of this front; returns how many there were."""
        rids = [rid for rid in self.front.held if not self.front.finished(rid)]
        for rid in rids:
            self.front.abort(rid)
        return len(rids)

    async def unpin(self, rid: int) -> None:
        """Release the prefix of a request generated with pin=True."""
        self.front.unpin(rid)

    # --- control -------------------------------------------------------------------------------
    async def flush_cache(self) -> int:
        """Drop every unlocked cached KV page; returns the tokens freed."""
        return int((await self._call("flush_cache"))["freed_tokens"])

    @property
    def lora_enabled(self) -> bool:
        """Does the runtime serve LoRA adapters (--lora-paths, --enable-lora)?"""
        return self.link.info.get("lora_adapters") is not None

    @property
    def loras(self) -> dict[str, dict[str, Any]]:
        """The LoRA adapters served (name -> path, rank, modules, digest): what the scheduler
        said at start, kept current by load_lora / unload_lora."""
        if self._loras is None:
            listed = self.link.info.get("lora_adapters") or []
            self._loras = {a["name"]: a for a in listed}
        return self._loras

    async def load_lora(self, name: str, path: str) -> dict[str, Any]:
        """Serve the adapter in folder `path` as `name`: {"ok": True, "adapter": {...}} or
        {"ok": False, "error": message, "status": 400 | 404}."""
        result = dict(await asyncio.wrap_future(self.front.call_lora(name, path)))
        if result.get("ok"):
            self.loras[name] = result["adapter"]
        return result

    async def unload_lora(self, name: str) -> dict[str, Any]:
        """Stop serving adapter `name` (requests already under it finish with it)."""
        result = dict(await asyncio.wrap_future(self.front.call_lora(name, None)))
        if result.get("ok"):
            self.loras.pop(name, None)
        return result

    async def radix_tree(self, depth: int, limit: int, show_text: bool) -> TreeView:
        """The top of the radix tree (tree_messages.TreeView; a bad bound is a ValueError):
        adapters' namespaces by their names, and with `show_text` each node's first words.
        Every snapshot pauses the scheduler's loop between two steps, so however many pages
        and callers ask, the same question gets one snapshot per TREE_VIEW_MAX_AGE_S (the
        callers share it: the one being taken, or the last one while it is that fresh), and
        snapshots are taken one at a time, TREE_VIEW_INTERVAL_S apart at least, whatever the
        questions: many different ones wait their turn instead of stalling the scheduler."""
        key = (depth, limit, show_text)
        now = time.monotonic()
        self._tree_views = {k: v for k, v in self._tree_views.items()
                            if now - v[0] < TREE_VIEW_MAX_AGE_S}
        if key not in self._tree_views:
            task = asyncio.ensure_future(self._take_tree_view(depth, limit, show_text))
            self._tree_views[key] = (now, task)
        return await asyncio.shield(self._tree_views[key][1])

    async def _take_tree_view(self, depth: int, limit: int, show_text: bool) -> TreeView:
        async with self._tree_turn:
            wait = self._last_tree_view + TREE_VIEW_INTERVAL_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._last_tree_view = time.monotonic()
            future = self.front.call_tree_view(depth, limit,
                                               TEXT_HEAD_TOKENS if show_text else 0)
            taken = await asyncio.wrap_future(future)
        view = msgspec.convert(taken, TreeView)
        names = {f"lora:{adapter_key(a.get('digest', ''))}": f"lora:{name}"
                 for name, a in self.loras.items()}
        nodes = [msgspec.structs.replace(
            node, namespace=_adapter_named(node.namespace, names),
            text=self.tokenizer.decode(node.head_ids) if node.head_ids else None, head_ids=[])
            for node in view.nodes]
        return msgspec.structs.replace(view, nodes=nodes)

    async def server_info(self) -> dict[str, Any]:
        """Config and live counters: running, waiting, kv_total/free/evictable/locked/private,
        cache_hit_rate, prompt/cached/generated tokens, steps, preemptions."""
        info = await self._call("info")
        info["model"] = self.model_name
        info["decoded_image_bytes"] = self.decoded.held  # requests' pictures in this process
        info["decoded_images_refused"] = self.decoded.refused
        return info

    async def check_integrity(self) -> dict[str, Any]:
        """{"ok": True}, or {"ok": False, "error": ...} naming the leak or miscount."""
        return await self._call("check_integrity")

    async def _call(self, op: str) -> dict[str, Any]:
        return dict(await asyncio.wrap_future(self.front.call(op)))

    # --- callbacks -----------------------------------------------------------------------------
    def on_finish(self, callback: Callable[[RequestMetrics], None]) -> None:
        """Register callback(RequestMetrics) called once per finished request (for /metrics)."""
        self._callbacks.append(callback)

    def trace_with(self, tracer: RequestTracer) -> None:
        """Trace every request from now on (tokenizer/request_tracer.py)."""
        self.tracer = tracer
        self.on_finish(tracer.record)
        self.front.on_late_trace = tracer.late

    def on_pinned(self, callback: Callable[[int], None]) -> None:
        """Register callback(rid), called once per request whose prefix the runtime pinned, as
        soon as the manager learns of it (the pin service puts the pin under a lease)."""
        self._pin_callbacks.append(callback)

    def _pinned(self, rid: int) -> None:
        for callback in self._pin_callbacks:
            callback(rid)


def _adapter_named(namespace: str, names: dict[str, str]) -> str:
    """"lora:<digest>..." -> "lora:<adapter's name>..." where the adapter is served."""
    key, sep, rest = namespace.partition("/")
    return names.get(key, key) + sep + rest
