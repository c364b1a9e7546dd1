"""Messages that cross a process boundary: scheduler -> worker step plans and worker -> scheduler
results. msgspec Structs (msgpack on the wire), never pickle. `Engine` passes the same objects by
direct call; the process trio encodes them.

Sampling params travel typed (`SamplingParams` is a msgspec Struct): the receiving process
decodes them straight into the one class, never from a dict.

A step plan carries deltas only: the worker keeps each request's token ids and slot table, so a
decode entry names the request, one new slot and nothing else.
"""

from __future__ import annotations

import math

import msgspec

from radixrt.runtime.config import MAX_NAME_CHARS
from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.lora_messages import LoraAdapter, LoraModuleShapes, LoraRequest
from radixrt.runtime.pooling_params import PoolingInfo
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.trace_messages import RequestTrace
from radixrt.runtime.tree_messages import TreeViewRequest

# Priorities (lower = more urgent, default 0, vLLM's convention) are bounded to this magnitude.
MAX_PRIORITY = 1 << 20
# A request's queue deadline (`timeout`, seconds) is at most this long.
MAX_QUEUE_TIMEOUT_S = 24 * 3600.0


# KV tiers (docs/architecture.md, "KV tiers"): where a radix-tree node's pages live. Lower tiers
# are larger and slower; a page moves between them by PageMove.
DEVICE_TIER, HOST_TIER, DISK_TIER = 0, 1, 2
TIER_NAMES = ("device", "host", "disk")
NUM_TIERS = len(TIER_NAMES)


class WorkerRequest(msgspec.Struct, frozen=True):
    """First sight of a request by the worker (or again after preemption by recompute)."""

    rid: int
    prompt_ids: list[int]
    output_ids: list[int]  # tokens already sampled (re-admission after preemption)
    params: SamplingParams  # as the client gave them (decoded typed, validated on decode)
    max_tokens: int  # resolved once at admission (params.max_tokens None: the default rule)
    seed_offset: int = 0  # which of the n samples of its prompt this request is
    prefix_slots: list[int] = []  # slots of the cached prefix it starts from (radix cache hit)
    lora: str | None = None  # the LoRA adapter it runs under (LoraAdapter.key); None: the base
    images: list[ImageInput] = []  # its prompt's images (image_messages.py)


class Run(msgspec.Struct, frozen=True):
    """Compute `num_new` tokens of request `rid`: positions start .. start+num_new-1 of its token
    ids (prompt + outputs), with their K/V written to `new_slots`."""

    rid: int
    start: int
    num_new: int
    new_slots: list[int]
    sample: bool  # the chunk reaches the end of the known tokens: sample the next one
    prompt_logprob_from: int = -1  # >= 0: return prompt logprobs for prompt tokens from here
    fork_into: list[int] = []  # n > 1: sample once per child from the last row; children inherit KV
    # speculative decoding: tokens drafted after the run's last known token (a decode, or a
    # prompt's last chunk; num_new counts them, their slots are reserved too), a small tree: node
    # i hangs under draft_parents[i] (-1: the last known token; parents come first; empty: a
    # chain). The worker samples at every node and keeps the path the samples follow
    # (RunResult.accepted; worker/draft_verifier.py)
    draft: list[int] = []
    draft_parents: list[int] = []

    @property
    def known_end(self) -> int:
        """The position after the run's last known token (its drafts come after it)."""
        return self.start + self.num_new - len(self.draft)

    @property
    def draft_chain(self) -> int:
        """How long the draft's main line is: its first nodes, each under the one before."""
        parents = self.draft_parents
        if not parents:
            return len(self.draft)
        n = 1 if self.draft else 0
        while n < len(parents) and parents[n] == n - 1:
            n += 1
        return n


class SlotCopy(msgspec.Struct, frozen=True):
    """Copy-on-write: copy K/V of `src` slots to `dst` slots and point `rid`'s slot table at
    `dst` from position `start`."""

    rid: int
    start: int
    src: list[int]
    dst: list[int]


class Swap(msgspec.Struct, frozen=True):
    rid: int
    slots: list[int]


class PageMove(msgspec.Struct, frozen=True):
    """KV tiers: copy the K/V of pages `src` of tier `src_tier` to pages `dst` of tier `dst_tier`
    (page ids of each tier's pool; DEVICE_TIER, HOST_TIER, DISK_TIER). A move to the disk tier
    also says what its pages hold, for their records (a warm restart's index): the namespace,
    the digest of the tokens before the first page (worker/disk_format.py) and the tokens."""

    src_tier: int
    dst_tier: int
    src: list[int]
    dst: list[int]
    namespace: str | None = None
    prefix: bytes = b""
    tokens: list[int] = []


class PrefixGroup(msgspec.Struct, frozen=True):
    """Decode runs of one step whose slot tables begin with the same `length` slots (a radix-tree
    prefix they all hold): their attention reads that prefix once (cascade attention)."""

    rids: list[int]
    length: int


class StepPlan(msgspec.Struct, frozen=True, tag=True):
    """The worker applies the parts in field order: swap_out reads KV before anything in this
    step can overwrite the slots the scheduler just freed; moves run in the order the scheduler
    planned them (a page one frees may be the page a later one fills), before anything else
    writes KV; free comes before new_requests so a request preempted and re-admitted in one plan
    starts clean."""

    step_id: int
    swap_out: list[Swap] = []  # these slots -> host memory; the slot table is dropped
    moves: list[PageMove] = []  # KV tiers: demotions and load-backs, in order
    free: list[int] = []  # forget these requests (and any swapped KV they have)
    new_requests: list[WorkerRequest] = []
    copies: list[SlotCopy] = []
    swap_in: list[Swap] = []  # host KV -> these slots; the request's slot table becomes `slots`
    runs: list[Run] = []
    prefix_groups: list[PrefixGroup] = []  # over decode runs of `runs`; empty: no cascade
    flush_disk: bool = False  # answer once the disk KV tier's writes are done (a shutdown's)
    # LoRA adapters the worker may be asked for from this step on, and ones it may forget
    # (no request uses them any more); both before the plan's new requests
    lora_loads: list[LoraAdapter] = []
    lora_unloads: list[str] = []


class TokenLogprob(msgspec.Struct, frozen=True):
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = []


class RunResult(msgspec.Struct, frozen=True):
    rid: int  # the request that sampled (a child rid for forks)
    token: TokenLogprob | None = None
    prompt_logprobs: list[TokenLogprob] = []  # in prompt order from the run's prompt_logprob_from
    forced: list[int] = []  # jump-forward: tokens the grammar forces right after `token`
    # speculative decoding: the run's drafted tokens that verification kept, in order before
    # `token` (each is the token sampled at its position; `token` is sampled after the last)
    accepted: list[TokenLogprob] = []
    pooled: bytes = b""  # a pooling request's output, float32 little-endian (pooling_params.py)


class MaskTiming(msgspec.Struct, frozen=True):
    """The cost of a step's grammar masks: `rows` masks built in `seconds` (on the worker's mask
    thread, while the forward pass ran), of which the sampler waited `wait_seconds` after the
    logits were ready (the part the forward pass did not hide)."""

    rows: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0


class StepResult(msgspec.Struct, frozen=True, tag=True):
    step_id: int
    results: list[RunResult] = []
    num_tokens: int = 0  # tokens in the forward pass
    masks: MaskTiming | None = None  # None: no row of the step had a grammar
    move_seconds: float = 0.0  # spent on the plan's PageMoves (KV tiers)
    # this step's images through the vision encoder, from its cache, and the encoder's seconds
    images_encoded: int = 0
    image_cache_hits: int = 0
    image_encode_seconds: float = 0.0


class OutputDelta(msgspec.Struct, frozen=True, omit_defaults=True):
    """What one sample gained in a step, scheduler -> tokenizer. `owner` is the rid the client
    knows (the parent of n > 1 samples); `index` is the sample's index, -1 for all samples of an
    n > 1 request that ended before it forked (abort, error)."""

    rid: int
    owner: int
    index: int
    token_ids: list[int] = []
    logprobs: list[TokenLogprob] = []
    finish_reason: str | None = None
    cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] = []
    # the first delta of a sample: seconds from submission to first admission, and from then to
    # the first token (-1 otherwise)
    queue_s: float = -1.0
    prefill_s: float = -1.0
    pinned: bool = False  # the final delta of a pin request: its prefix is pinned (rid = pin id)
    pin_error: str | None = None  # ... or why the pin was refused
    pooled: bytes = b""  # the final delta of a pooling request: its vector or logits
    trace: RequestTrace | None = None  # the final delta of a traced request: its stages


# --- worker -> scheduler at start-up ------------------------------------------------------------
class TPLayout(msgspec.Struct, frozen=True):
    """How the model is split over its tensor-parallel ranks (models/shard_plan.py)."""

    tp_size: int
    heads_per_rank: int  # query heads, padding included
    kv_heads_per_rank: int
    padded_heads: int  # zero query heads added over all ranks
    kv_heads: str  # "split", "replicated" (more ranks than KV heads) or "padded"
    intermediate_per_rank: int
    vocab_per_rank: int
    kv_bytes_per_token_per_rank: int
    nnodes: int = 1
    backend: str = "gloo"


class CpuCompute(msgspec.Struct, frozen=True):
    """How the worker computes on the CPU: torch's threads (the products' and the kernels'),
    whether the CPU kernels run (kernels/cpu/), and how its OpenMP threads wait."""

    threads: int
    kernels: bool
    openmp_wait: str


class WorkerReady(msgspec.Struct, frozen=True, tag=True):
    num_pages: int
    page_size: int
    context_length: int
    vocab_size: int
    eos_token_ids: list[int]
    device: str
    dtype: str
    kv_bytes_per_token: int = 0  # K and V (or the latent) of one token over all layers
    host_pages: int = 0  # the KV tiers below the pool (0: none)
    disk_pages: int = 0
    tp: TPLayout | None = None  # the tensor-parallel layout (None: one rank)
    # bytes of weights per format ("u4/g32/f16": packed 4-bit codes, "float32", ...), one rank's
    weight_formats: dict[str, int] = {}
    cpu: CpuCompute | None = None  # on the CPU: its threads and kernels (None: a GPU)
    # the projections LoRA adapters may adapt (None: the worker serves no adapters)
    lora_shapes: LoraModuleShapes | None = None
    lora_max_rank: int = 0  # the adapter slots' rank (--max-lora-rank, resolved)
    pooling: PoolingInfo = PoolingInfo()  # what pooling requests the model serves
    takes_images: bool = False  # a vision-language model: prompts may carry images
    image_blocks: bool = False  # ... whose runs are computed whole (rows seen both ways)


# --- tokenizer <-> scheduler ---------------------------------------------------------------------
class Scheduling(msgspec.Struct, frozen=True):
    """How the scheduler treats a request, beside what it generates (its SamplingParams):

    - priority: lower is more urgent (default 0, vLLM's convention); the waiting queue orders
      by it first, and a waiting request may preempt running requests of a larger priority;
    - tenant: whose request it is (an API key's name, the OpenAI `user`, "" for everyone else);
      within a priority level, admissions interleave tenants by the tokens each was served;
    - extra_key: the radix cache's namespace (`cache_salt` over HTTP): requests with different
      keys never share cached KV;
    - timeout_s: a request still waiting (never admitted) this many seconds after it was queued
      ends with an error.
    - lora: the LoRA adapter it runs under, by the name it was loaded as; its KV lives in the
      adapter's own namespace of the radix tree (with extra_key inside it).
    - trace: the scheduler records its stages (queued, prefix matched, prefill chunks,
      speculation) and sends them with its final output, for OpenTelemetry spans.

    Every field is bounded here, so a bad value is refused before anything is queued."""

    priority: int = 0
    tenant: str = ""
    extra_key: str | None = None
    timeout_s: float | None = None
    lora: str | None = None  # the name of the LoRA adapter it runs under (None: the base model)
    trace: bool = False  # record its stages for tracing (trace_messages.RequestTrace)

    def __post_init__(self) -> None:
        if not -MAX_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"priority={self.priority} is out of range: use an integer in "
                             f"[{-MAX_PRIORITY}, {MAX_PRIORITY}] (lower is more urgent)")
        for name in ("tenant", "extra_key", "lora"):
            value = getattr(self, name)
            shown = "cache_salt" if name == "extra_key" else name
            if value is not None and len(value) > MAX_NAME_CHARS:
                raise ValueError(f"{shown} has {len(value)} characters; at most "
                                 f"{MAX_NAME_CHARS} are allowed")
            if value is not None and "\0" in value:
                raise ValueError(f"{shown} contains a NUL character")
        timeout = self.timeout_s
        if timeout is not None and not (math.isfinite(timeout)
                                        and 0 < timeout <= MAX_QUEUE_TIMEOUT_S):
            raise ValueError(f"timeout={timeout} is invalid: give seconds in "
                             f"(0, {MAX_QUEUE_TIMEOUT_S:.0f}] (how long it may wait in the "
                             "queue), or leave it out")


class SubmitRequest(msgspec.Struct, frozen=True, tag=True):
    rid: int  # chosen by the tokenizer process (>= 0); n > 1 children get negative rids
    prompt_ids: list[int]
    params: SamplingParams  # built and validated once at the edge; decoded typed
    scheduling: Scheduling = Scheduling()
    pin: bool = False  # keep the finished prefix locked in the radix tree until UnpinRequest
    # False: its grammar is compiling; it waits in the queue (counted against the caps) and is
    # not admitted before GrammarReady
    grammar_ready: bool = True
    images: list[ImageInput] = []  # its prompt's images: their placeholder ids are in prompt_ids


class GrammarReady(msgspec.Struct, frozen=True, tag=True):
    rid: int  # a request submitted with grammar_ready=False: the worker can load its grammar


class UnpinRequest(msgspec.Struct, frozen=True, tag=True):
    rid: int  # a finished request submitted with pin=True


class AbortRequest(msgspec.Struct, frozen=True, tag=True):
    rid: int
    # "abort"; "stop" when the detokenizer saw a stop string; "error: ..." when its grammar
    # failed to compile
    reason: str = "abort"


class ControlRequest(msgspec.Struct, frozen=True, tag=True):
    call_id: int
    op: str  # "info" | "flush_cache"


class DeltaBatch(msgspec.Struct, frozen=True, tag=True):
    deltas: list[OutputDelta]


class SubmitError(msgspec.Struct, frozen=True, tag=True):
    rid: int
    message: str
    retry_after_s: int = 0  # > 0: refused because a queue is full (QueueFull), not invalid


class ControlReply(msgspec.Struct, frozen=True, tag=True):
    call_id: int
    result: dict


class SchedulerReady(msgspec.Struct, frozen=True, tag=True):
    info: dict


# --- DSL client <-> tokenizer (ZeroMQ DEALER/ROUTER) -------------------------------------------
class DslRequest(msgspec.Struct, frozen=True, tag=True):
    """op "generate": run `text` (or `input_ids`) with `params` (the same SamplingParams the
    HTTP side builds, decoded typed and validated on decode: a bad field is refused with the
    call's id and a message naming it); with
    `pin`, the finished prefix stays locked in the radix cache until op "unpin" with the reply's
    pin_id, for as long as the client renews its lease (op "renew" with `pin_ids`, more often
    than the `pin_lease_ttl_s` that op "info" reports). op "score": the log-probability of each
    of `choices` as a continuation of `text` (and, with `unconditional`, of each choice alone)
    in one batch. op "embed": the embedding of `text` (or `input_ids`), cut to `dimensions`.
    op "abort": cancel the call
    `call_id`; op "info": server_info plus the chat template's role markers."""

    call_id: int
    op: str = "generate"
    text: str | None = None
    input_ids: list[int] | None = None
    params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    stream: bool = False
    pin: bool = False
    pin_id: int = -1
    choices: list[str] = []
    unconditional: bool = False
    api_key: str | None = None  # required (compared in constant time) when the server has one
    pin_ids: list[int] = []  # op "renew": the pins whose leases to extend
    priority: int = 0  # op "generate": lower is more urgent (Scheduling.priority)
    lora: str | None = None  # op "generate": the LoRA adapter it runs under (Scheduling.lora)
    dimensions: int | None = None  # op "embed": keep the embedding's first N entries
    # op "generate" with the server's --reasoning-parser: the thinking apart (DslSample.reasoning)
    # and constraints after it
    separate_reasoning: bool = False
    # op "generate" / "score": the image files (PNG, JPEG, ...; untrusted, decoded by the
    # server under its media limits) whose image tokens `text` holds, in order
    images: list[bytes] = []


class DslReply(msgspec.Struct, frozen=True, tag=True):
    """Streamed pieces (done=False) then one final reply (done=True) with the whole output of
    every sample, or with `error` set (the request was refused: nothing ran)."""

    call_id: int
    done: bool
    index: int = 0
    text: str = ""
    token_ids: list[int] = []
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = []
    prompt_logprobs: list[TokenLogprob] = []  # final reply, with params prompt_logprobs_start
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    info: dict = {}
    samples: list[DslSample] = []
    pin_id: int = -1  # generate with pin: what to send back in op "unpin" (-1: not pinned)
    pin_error: str | None = None  # generate with pin: why it was not pinned (the pin budget)
    choices: list[DslChoice] = []  # op "score"
    embedding: list[float] = []  # op "embed"


class DslChoice(msgspec.Struct, frozen=True):
    """Scores of one choice: the log-probability of each of its tokens given the text (from the
    first token where the choices' tokenizations part from the text's), and given only a start
    token (when asked for unconditional scores)."""

    token_ids: list[int]
    logprobs: list[float]
    unconditional_logprobs: list[float] = []


class DslToolCall(msgspec.Struct, frozen=True):
    """A call the output made (params tool_calls): the tool's name, its arguments' JSON text."""

    name: str
    arguments: str


class DslSample(msgspec.Struct, frozen=True):
    """One sample's output, as the model wrote it; with tool_calls in the params, its calls
    parsed (the text keeps the call blocks); with separate_reasoning, the thinking (`reasoning`,
    None where the output had none) and the answer after it (`content`) apart."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list[TokenLogprob] = []
    tool_calls: list[DslToolCall] = []
    reasoning: str | None = None
    content: str | None = None


ToScheduler = (SubmitRequest | GrammarReady | AbortRequest | ControlRequest | UnpinRequest
               | LoraRequest | TreeViewRequest)
ToTokenizer = DeltaBatch | SubmitError | ControlReply | SchedulerReady
FromWorker = WorkerReady | StepResult
