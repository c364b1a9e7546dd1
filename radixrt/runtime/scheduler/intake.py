"""The scheduler's side of the tokenizer link: every message from the request front is handled
here, whether it came over ZeroMQ (the scheduler process) or by a direct call (the Engine).

`handle` takes one `ToScheduler` message and returns the `ToTokenizer` replies it causes:
- SubmitRequest: queued by `Scheduler.add_request` (where the checks that need the model are
  made: context length, vocabulary); a refusal becomes a SubmitError (retry_after_s > 0 for a
  full queue). A request whose grammar is still compiling waits in the queue, counted against
  its caps, until GrammarReady;
- GrammarReady: its grammar is compiled (the worker loads it): it may be admitted;
- AbortRequest: "abort" ends it and its samples wherever they are; any other reason ends it
  with that reason ("stop": the front saw a stop string; "error: ...": its grammar failed);
- UnpinRequest, ControlRequest ("info", "flush_cache", "check_integrity");
- TreeViewRequest: a bounded snapshot of the radix tree's top (tree_view.py), as builtins.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import msgspec

from radixrt.runtime.errors import QueueFull
from radixrt.runtime.messages import (
    AbortRequest,
    ControlReply,
    ControlRequest,
    DeltaBatch,
    GrammarReady,
    LoraRequest,
    SubmitError,
    SubmitRequest,
    ToScheduler,
    ToTokenizer,
    UnpinRequest,
    WorkerReady,
)
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler
from radixrt.runtime.scheduler.tree_view import snapshot
from radixrt.runtime.tree_messages import TreeViewRequest

LABEL_SECRET_BYTES = 32


class SchedulerIntake:
    def __init__(self, scheduler: Scheduler, ready: WorkerReady) -> None:
        self.scheduler = scheduler
        self.ready = ready
        self._label_secret = os.urandom(LABEL_SECRET_BYTES)  # keys the tree view's salt labels

    def handle(self, msg: ToScheduler) -> list[ToTokenizer]:
        sched = self.scheduler
        if isinstance(msg, SubmitRequest):
            return self._submit(msg)
        if isinstance(msg, GrammarReady):
            sched.grammar_ready(msg.rid)
            return []
        if isinstance(msg, AbortRequest):
            if msg.reason == "abort":
                return self.deltas(sched.abort(msg.rid))
            return self.deltas(sched.finish(msg.rid, msg.reason))
        if isinstance(msg, UnpinRequest):
            sched.unpin(msg.rid)
            return []
        if isinstance(msg, ControlRequest):
            return [ControlReply(call_id=msg.call_id, result=self.control(msg.op))]
        if isinstance(msg, TreeViewRequest):
            view = snapshot(self.scheduler.kv.tree, msg, self._label_secret)
            return [ControlReply(call_id=msg.call_id, result=msgspec.to_builtins(view))]
        if isinstance(msg, LoraRequest):
            return [ControlReply(call_id=msg.call_id, result=self.lora(msg.name, msg.path))]
        raise TypeError(f"not a message for the scheduler: {type(msg).__name__}")

    def _submit(self, msg: SubmitRequest) -> list[ToTokenizer]:
        try:
            self.scheduler.add_request(msg.prompt_ids, msg.params, msg.scheduling, rid=msg.rid,
                                       pin=msg.pin, grammar_ready=msg.grammar_ready,
                                       images=msg.images)
        except QueueFull as exc:
            return [SubmitError(rid=msg.rid, message=str(exc), retry_after_s=exc.retry_after_s)]
        except (ValueError, TypeError) as exc:
            return [SubmitError(rid=msg.rid, message=str(exc))]
        return []

    def deltas(self, touched: Sequence[Request]) -> list[ToTokenizer]:
        """The outputs the touched requests gained, as one DeltaBatch (none if nothing)."""
        found = self.scheduler.take_deltas(touched)
        return [DeltaBatch(deltas=found)] if found else []

    def control(self, op: str) -> dict[str, Any]:
        sched = self.scheduler
        if op == "flush_cache":
            return {"freed_tokens": sched.flush_cache()}
        if op == "check_integrity":
            try:
                sched.check_integrity()
            except RuntimeError as exc:
                return {"ok": False, "error": str(exc)}
            return {"ok": True}
        return self.info()

    def lora(self, name: str, path: str | None) -> dict[str, Any]:
        """Load adapter `name` from folder `path` (None: unload it): {"ok": True, "adapter":
        {...}} or {"ok": False, "error": message, "status": 400 | 404}."""
        table = self.scheduler.lora
        try:
            loaded = table.unload(name) if path is None else table.load(name, path)
        except KeyError as exc:
            return {"ok": False, "error": str(exc.args[0]), "status": 404}
        except ValueError as exc:
            return {"ok": False, "error": str(exc), "status": 400}
        except Exception as exc:  # a folder malformed past the checks: refused, never fatal
            return {"ok": False, "status": 400,
                    "error": f"{path}: not a readable LoRA adapter ({type(exc).__name__}: "
                             f"{str(exc)[:200]})"}
        return {"ok": True, "adapter": loaded.describe()}

    def info(self) -> dict[str, Any]:
        """Config and live counters: what /server_info and the DSL's op "info" report."""
        sched, ready = self.scheduler, self.ready
        info = sched.stats_dict()
        info.update(
            device=ready.device,
            dtype=ready.dtype,
            context_length=sched.context_length,
            schedule_policy=sched.config.schedule_policy,
            preemption=sched.config.preemption,
            disable_radix_cache=sched.config.disable_radix_cache,
            grammar_backend=sched.config.grammar_backend,
            grammar_compile_timeout=sched.config.grammar_compile_timeout,
            vocab_size=ready.vocab_size,
            eos_token_ids=list(ready.eos_token_ids),
            tensor_parallel=msgspec.to_builtins(ready.tp) if ready.tp else None,
            weight_formats=dict(ready.weight_formats),
            cpu=msgspec.to_builtins(ready.cpu) if ready.cpu else None,
            lora_adapters=sched.lora.listing() if sched.lora.enabled else None,
            max_loras_per_batch=sched.config.max_loras_per_batch,
            max_lora_rank=ready.lora_max_rank,
            pooling=msgspec.to_builtins(ready.pooling),
        )
        return info
