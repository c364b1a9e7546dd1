"""KV capacity as an operator plans with it: the arithmetic the worker sizes its pool with, and
what the pool then holds — bytes per token, pages, tokens, concurrent requests at a length —
for the running server (start-up log, /server_info) and, from a model's config alone, for
`radixrt plan` (no weights loaded, any model, any memory size).

Concurrency at a length: a paged pool holds a request in ceil(tokens / page_size) pages, so it
fits pool_tokens // (its pages' tokens) such requests. A contiguous allocator (one region per
request, reserved for its longest possible output) fits pool_tokens // (prompt + max_output).
A prefix shared by every request is held (and computed) once: each request then needs only
its own part beyond it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from radixrt.runtime.worker.disk_format import BLOCK_BYTES, Geometry

if TYPE_CHECKING:  # torch-free at run time: the scheduler process states capacity too
    from radixrt.runtime.forward.kv_cache import KVShape
    from radixrt.runtime.models.model_config import ModelConfig

# The request length (prompt + output) capacity is also stated at, beside the context length
# (start-up log, /server_info, `radixrt plan`).
TYPICAL_REQUEST_TOKENS = 1024

GIB = 1 << 30


def kv_bytes_per_token(config: KVShape, dtype_bytes: int) -> int:
    """K and V (or MLA's latent) of one token across all layers (of one rank's KV heads under
    tensor parallelism: ShardPlan.kv_shape; ModelConfig.kv_layout for the whole model).
    DeepSeek-V3 in bf16: 1 latent x (512 + 64) dims x 61 layers x 2 bytes = 70,272."""
    return (config.kv_parts * config.num_layers * config.num_kv_heads * config.head_dim
            * dtype_bytes)


def kv_counted(config: ModelConfig) -> str:
    """How kv_bytes_per_token counts: "K and V: 2 x 8 heads x 128 dims x 32 layers", or
    "latent: (512 + 64) dims x 61 layers" for multi-head latent attention."""
    layout = config.kv_layout
    if layout.kv_parts == 1:
        return (f"latent: ({config.kv_lora_rank} + {config.qk_rope_head_dim}) dims x "
                f"{layout.num_layers} layers")
    return (f"K and V: 2 x {layout.num_kv_heads} heads x {layout.head_dim} dims x "
            f"{layout.num_layers} layers")


def _latent_projections(config: ModelConfig) -> int:
    """An MLA layer's projections that --quantization packs: q_a and q_b (or q), kv_a, o
    (kv_b stays in floats: models/mla.py)."""
    h, q, q_rank = config.hidden_size, config.num_heads * config.head_dim, config.q_lora_rank
    attn = (h * q_rank + q_rank * q) if q_rank else h * q
    return attn + h * (config.kv_lora_rank + config.qk_rope_head_dim) + (
        config.num_heads * config.v_head_dim * h)


def _latent_attention_parameters(config: ModelConfig) -> int:
    """An MLA layer's weights (models/mla.py): its projections, kv_b, norms and biases."""
    h, rank, rope, q_rank = (config.hidden_size, config.kv_lora_rank, config.qk_rope_head_dim,
                             config.q_lora_rank)
    kv_b = rank * config.num_heads * (config.qk_nope_head_dim + config.v_head_dim)
    norms = q_rank + rank + 2 * h  # q_a's and kv_a's, and the layer's two
    biases = (q_rank + rank + rope if config.attention_bias else 0) + (
        h if config.o_proj_bias else 0)
    return _latent_projections(config) + kv_b + norms + biases


def _attention_parameters(config: ModelConfig) -> int:
    if config.kv_lora_rank:
        return _latent_attention_parameters(config)
    h, q, kv = (config.hidden_size, config.num_heads * config.head_dim,
                config.num_kv_heads * config.head_dim)
    count = h * q + 2 * h * kv + q * h + (q + 2 * kv if config.attention_bias else 0)
    count += (h if config.o_proj_bias else 0) + (config.num_heads if config.attention_sinks else 0)
    norms = {"pre": 2, "sandwich": 4, "post": 2}[config.norm_layout] * h
    if config.qk_norm_all_heads:
        norms += q + kv
    elif config.qk_norm:
        norms += 2 * config.head_dim
    return count + norms


def projection_parameters(config: ModelConfig) -> int:
    """The weights of every layer's projections (q, k, v, o; gate, up, down of a dense MLP or a
    shared expert): what --quantization quantizes besides the embedding and the head."""
    h, q, kv = (config.hidden_size, config.num_heads * config.head_dim,
                config.num_kv_heads * config.head_dim)
    mlp = [3 * h * (config.shared_expert_intermediate_size if moe else config.intermediate_size)
           for moe in config.moe_kinds]
    if config.kv_lora_rank:
        return config.num_layers * _latent_projections(config) + sum(mlp)
    return config.num_layers * (2 * h * q + 2 * h * kv) + sum(mlp)


def expert_parameters(config: ModelConfig) -> int:
    """One expert's weights (gate, up, down and their biases)."""
    h, inter = config.hidden_size, config.moe_intermediate_size
    return 3 * h * inter + ((2 * inter + h) if config.expert_bias else 0)


def _moe_parameters(config: ModelConfig) -> int:
    """A MoE block without its experts: the router and the shared expert with its gate."""
    h, shared = config.hidden_size, config.shared_expert_intermediate_size
    router = config.num_experts * h + (config.num_experts if config.router_bias else 0)
    router += config.num_experts if config.score_correction_bias else 0
    gate = h if config.shared_expert_gated else 0
    return router + (3 * h * shared + gate if shared else 0)


def parameter_count(config: ModelConfig, active: bool = False) -> int:
    """The weights the decoder holds (what models/decoder.py builds for this config); active:
    those one token runs through (a MoE layer's top_k experts, not all of them)."""
    h = config.hidden_size
    per_layer = []
    for moe in config.moe_kinds:
        mlp = 3 * h * config.intermediate_size
        if moe:
            used = config.num_experts_per_tok if active else config.num_experts
            mlp = _moe_parameters(config) + used * expert_parameters(config)
        per_layer.append(_attention_parameters(config) + mlp)
    embed = config.vocab_size * h
    head = 0 if config.tie_word_embeddings else config.vocab_size * h
    return embed + sum(per_layer) + h + head


def pool_tokens(free_bytes: int, mem_fraction: float, bytes_per_token: int) -> int:
    """The pool the worker makes without an explicit max_total_tokens."""
    return int(free_bytes * mem_fraction) // bytes_per_token


def typical_request_tokens(context_length: int) -> int:
    """The "typical" length capacity is stated at beside the context length."""
    return min(TYPICAL_REQUEST_TOKENS, context_length)


def ceil_to(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size) * page_size


@dataclass(frozen=True)
class Capacity:
    """A KV pool: its pages and what one token costs in it."""

    bytes_per_token: int
    page_size: int
    pages: int
    context_length: int

    @property
    def tokens(self) -> int:
        return self.pages * self.page_size

    def concurrency(self, tokens_per_request: int, shared_prefix: int = 0) -> int:
        """Requests of that many tokens the pool holds at once (paged), with a prefix of
        `shared_prefix` tokens held once for all of them."""
        own = ceil_to(max(tokens_per_request - shared_prefix, 1), self.page_size)
        return max(self.tokens - ceil_to(shared_prefix, self.page_size), 0) // own

    def info(self, typical_tokens: int) -> dict[str, Any]:
        """For /server_info."""
        return {**asdict(self), "tokens": self.tokens,
                "bytes": self.tokens * self.bytes_per_token,
                "max_concurrency_at_context_length": self.concurrency(self.context_length),
                "typical_request_tokens": typical_tokens,
                "max_concurrency_at_typical_length": self.concurrency(typical_tokens)}

    def describe(self, typical_tokens: int) -> str:
        """The start-up log's line, as vLLM states it."""
        size = self.tokens * self.bytes_per_token / GIB
        return (f"KV cache: {self.bytes_per_token} bytes per token, {self.pages} pages of "
                f"{self.page_size} = {self.tokens} tokens ({size:.2f} GiB); maximum concurrency "
                f"for {self.context_length} tokens per request: "
                f"{self.concurrency(self.context_length)}, for {typical_tokens}: "
                f"{self.concurrency(typical_tokens)}")


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int
    mean_output_tokens: int
    max_output_tokens: int
    shared_prefix_tokens: int = 0  # of the prompt, the same for every request
    requests: int = 1  # how many share that prefix (for the prefill it saves)


def plan(config: ModelConfig, memory_bytes: int, dtype_bytes: int, page_size: int,
         mem_fraction: float, context_length: int, work: Workload,
         weight_bytes: int | None = None) -> dict[str, Any]:
    """What a server for this model would hold on a device of `memory_bytes`, from the config
    alone: the weights (weight_bytes where they are not all floats of dtype_bytes: packed or
    quantized), the pool (as the worker sizes it), and how many requests of `work` run at once
    with contiguous reservation and with paged allocation (and a shared prefix).
    ValueError when the weights alone do not fit, or a request cannot fit the context."""
    if work.prompt_tokens + work.max_output_tokens > context_length:
        raise ValueError(f"prompt {work.prompt_tokens} + max output {work.max_output_tokens} "
                         f"tokens exceed the context length {context_length}")
    if not 0 <= work.shared_prefix_tokens <= work.prompt_tokens:
        raise ValueError("the shared prefix must be part of the prompt: 0 <= shared <= prompt")
    if work.mean_output_tokens > work.max_output_tokens:
        raise ValueError("the mean output cannot exceed the maximum output")
    weights = parameter_count(config) * dtype_bytes if weight_bytes is None else weight_bytes
    free = memory_bytes - weights
    if free <= 0:
        raise ValueError(f"the weights alone take {weights / GIB:.2f} GiB of the "
                         f"{memory_bytes / GIB:.2f} GiB: nothing is left for the KV cache")
    per_token = kv_bytes_per_token(config.kv_layout, dtype_bytes)
    pages = pool_tokens(free, mem_fraction, per_token) // page_size
    capacity = Capacity(per_token, page_size, pages, context_length)
    mean = work.prompt_tokens + work.mean_output_tokens
    worst = work.prompt_tokens + work.max_output_tokens
    shared = work.shared_prefix_tokens
    return {
        "parameters": parameter_count(config),
        "active_parameters": parameter_count(config, active=True),
        "expert_parameters": (sum(config.moe_kinds) * config.num_experts
                              * expert_parameters(config)),
        "weight_bytes": weights,
        "kv_bytes_per_token": per_token,
        "kv_per_token": kv_counted(config),
        "pool_pages": pages,
        "pool_tokens": capacity.tokens,
        "pool_bytes": capacity.tokens * per_token,
        "concurrent_contiguous": capacity.tokens // worst,
        "concurrent_paged": capacity.concurrency(mean),
        "concurrent_paged_worst_case": capacity.concurrency(worst),
        "concurrent_paged_shared_prefix": capacity.concurrency(mean, shared),
        "prefill_tokens_saved": max(work.requests - 1, 0) * shared,
        "prefill_fraction_saved": (max(work.requests - 1, 0) * shared
                                   / max(work.requests * work.prompt_tokens, 1)),
        "max_concurrency_at_context_length": capacity.concurrency(context_length),
    }


def tier_tokens(bytes_per_token: int, page_size: int, host_bytes: int,
                disk_bytes: int) -> tuple[int, int]:
    """The KV tiers that `host_bytes` of host memory and `disk_bytes` of disk hold, in tokens
    (whole pages; a disk page also carries its record: disk_format.py)."""
    host = host_bytes // (bytes_per_token * page_size) * page_size
    geometry = Geometry(page_size, bytes_per_token * page_size, 0)
    per_page = geometry.page_bytes + geometry.record_bytes
    disk = max(disk_bytes - geometry.data_offset - BLOCK_BYTES, 0) // per_page * page_size
    return host, disk
