"""The scheduler's view of one request: its tokens, its KV pages, where it is in its life."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.scheduler.draft_index import ContextIndex
from radixrt.runtime.trace_messages import RequestTrace

if TYPE_CHECKING:
    from radixrt.runtime.scheduler.radix_cache import RadixNode


class Phase(enum.Enum):
    WAITING = "waiting"  # queued (new, or preempted by recompute)
    SWAPPED = "swapped"  # preempted by swap: KV in host memory, waiting to come back
    RUNNING = "running"  # holds KV pages; prefilling or decoding
    FINISHED = "finished"


@dataclass
class DraftState:
    """A request's speculative decoding (speculator.py): its own n-grams, its draft length, and
    its back-off after drafts that were all rejected (or found nothing)."""

    length: int
    context: ContextIndex = field(default_factory=ContextIndex)
    skip: int = 0  # steps it plans without drafting (back-off)
    whole: bool = False  # its last verified main line was accepted whole
    backoff: int = 0  # the back-off after its next miss is twice this (at least 1)


@dataclass(eq=False)
class Request:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int  # params.max_tokens resolved at admission (0: prefill only)
    arrival: int  # monotonically increasing submission counter (fcfs order)
    extra_key: str | None = None  # radix-cache namespace: different keys never share KV
    lora: str | None = None  # the LoRA adapter it runs under (the worker's key); None: base
    images: list[ImageInput] = field(default_factory=list)  # its prompt's (image_messages.py)
    priority: int = 0  # lower is more urgent
    tenant: str = ""  # whose request it is (fair share between tenants)
    deadline_s: float | None = None  # monotonic seconds: still never admitted by then -> error
    seed_offset: int = 0  # which of the n samples of its prompt this request is
    parent_rid: int | None = None  # set on the n children of an n > 1 request
    pin: bool = False  # on a normal finish, keep its prefix locked in the tree until unpinned
    grammar_ready: bool = True  # False while its grammar compiles: waiting, never admitted
    pin_error: str | None = None  # why a pin was refused (the pin budget)
    output_ids: list[int] = field(default_factory=list)
    phase: Phase = Phase.WAITING
    # KV bookkeeping (owned by KVManager)
    pages: list[int] = field(default_factory=list)  # page of each page_size run of positions
    kv_len: int = 0  # positions whose K/V is computed (or planned in the current step)
    cached_len: int = 0  # prompt tokens served from the radix cache at (first) admission
    prefix_on_device: int = 0  # of its latest admission try: matched tokens on the device
    tree_node: RadixNode | None = None  # deepest radix node this request holds a lock on
    admitted_at: int = -1  # admission counter: preemption picks the most recent
    # outputs it had at its latest admission or swap-in: fair share preempts it only once it
    # has written fair_share_quantum more
    outputs_at_start: int = 0
    # monotonic seconds: when it was queued and first admitted (for the queue / prefill times)
    submitted_s: float = 0.0
    admitted_s: float = -1.0
    num_preemptions: int = 0
    kv_len_swapped: int = 0  # positions whose K/V sits in host memory while SWAPPED
    prompt_logprobs_done: bool = False
    finish_reason: str | None = None
    num_sent: int = 0  # output tokens already reported to the client side
    # Tokens sampled by a step still in flight: output_ids ends with this many PLACEHOLDER_TOKENs
    # until the worker's result replaces them, so the next step can be planned meanwhile.
    pending: int = 0
    epoch: int = 0  # bumped by a recompute preemption: results planned before it are stale
    forking: bool = False  # n > 1: the step that forks it is planned and not yet folded in
    abort_requested: bool = False  # aborted while forking: its children are aborted on arrival
    draft_state: DraftState | None = None  # speculative decoding, from its first draft on
    # per-token outputs gathered as the worker reports them
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    pooled: bytes = b""  # a pooling request's output (RunResult.pooled), once computed
    trace: RequestTrace | None = None  # its stages, recorded only when Scheduling.trace asks

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_known(self) -> int:
        """Tokens whose ids are known (prompt + outputs, minus in-flight placeholders)."""
        return self.num_tokens - self.pending

    @property
    def num_known_outputs(self) -> int:
        return len(self.output_ids) - self.pending

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next sample."""
        return self.num_tokens - self.kv_len

    @property
    def is_decoding(self) -> bool:
        return self.phase is Phase.RUNNING and self.remaining == 1 and bool(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED

    @property
    def fork_count(self) -> int:
        """n > 1 prompts are prefilled once by a parent that forks into n children."""
        return self.params.n if self.parent_rid is None else 1

    def prompt_logprob_from(self) -> int:
        start = self.params.prompt_logprobs_start
        if start is None or self.prompt_logprobs_done:
            return -1
        return max(start, 1)
