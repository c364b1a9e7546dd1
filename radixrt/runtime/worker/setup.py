"""The one worker factory: device and dtype, the attention backend, the model, the KV pool's
size, and the `WorkerReady` report the scheduler is sized from. The Engine, the worker process
and every tensor-parallel rank build their worker here, so all run the same model (each rank its
shard) on the same pool."""

from __future__ import annotations

import logging

import psutil
import torch

from radixrt.runtime.config import (
    HICACHE_HOST_RATIO,
    MAX_LORA_RANK,
    MAX_TIER_TOKENS,
    EngineConfig,
)
from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.attention import resolve_attention_backend
from radixrt.runtime.messages import CpuCompute, LoraModuleShapes, TPLayout, WorkerReady
from radixrt.runtime.models.loader import LoadedModel, inspect_model, load_model, resolve_dtype
from radixrt.runtime.models.lora_format import module_shapes, read_spec
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.pooling_config import read_pooling_info
from radixrt.runtime.models.shard_plan import check_tp_size
from radixrt.runtime.worker.capacity import kv_bytes_per_token, pool_tokens
from radixrt.runtime.worker.cpu_waiting import openmp_wait
from radixrt.runtime.worker.disk_format import Geometry
from radixrt.runtime.worker.kv_tiers import (
    DISK_TIER_AUTO_MAX_BYTES,
    DISK_TIER_FREE_FRACTION,
    DiskFile,
    KVTiers,
    auto_disk_pages,
    fingerprint,
    model_fingerprint,
)
from radixrt.runtime.worker.lora_manager import LoraManager
from radixrt.runtime.worker.worker import Worker

log = logging.getLogger("radixrt.worker")

# Without an explicit max_total_tokens the pool takes mem_fraction of free memory, capped here on
# the CPU (host RAM is shared with everything else on the machine).
CPU_MAX_POOL_TOKENS = 1 << 15
# A host KV tier may take at most this share of the host memory available when it is made.
HOST_TIER_MAX_FRACTION = 0.8
DEFAULT_MAX_LORA_RANK = 16  # the adapter slots' rank when no adapter is given at start


def resolve_device(name: str) -> torch.device:
    """"auto": cuda when available, else cpu. A CUDA device that is not there is refused."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={name!r}: no CUDA device is visible to torch "
                             "(torch.cuda.is_available() is False); use device='cpu'")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"device={name!r}: only {count} CUDA device(s) are visible "
                             f"(cuda:0 .. cuda:{count - 1})")
    return device


def context_length_for(config: EngineConfig, model: ModelConfig) -> int:
    """The context length the runtime serves: config.context_length, else the model's; refused
    past the model's positions. Sliding-window layers are exact at any length (the attention
    backends mask by window), so a window does not bound it."""
    length = config.context_length or model.max_position_embeddings
    if length > model.max_position_embeddings:
        raise ValueError(f"context_length={length} exceeds the model's "
                         f"{model.max_position_embeddings} positions: use "
                         f"context_length={model.max_position_embeddings} or less")
    return length


def check_config(config: EngineConfig) -> None:
    """What build_worker would refuse, found without loading weights (the server checks it
    before it starts any process): the model, the device, the context length, the TP plan."""
    model = inspect_model(config.model)
    context_length_for(config, model)
    check_tp_size(model, config.tp_size)
    rank_device(config, 0)
    if config.tp_size > 1:
        rank_device(config, config.tp_size // config.nnodes - 1)


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """The device of a tensor-parallel rank: config.device, and on CUDA under tensor
    parallelism cuda:(base_gpu_id + the rank's index on its node)."""
    device = resolve_device(config.device)
    if device.type != "cuda" or config.tp_size == 1:
        return device
    local = rank % (config.tp_size // config.nnodes)
    return resolve_device(f"cuda:{config.base_gpu_id + local}")


def dist_backend(config: EngineConfig) -> str:
    """The layers' collective backend: auto = nccl on CUDA, gloo on the CPU."""
    if config.dist_backend != "auto":
        if config.dist_backend == "nccl" and resolve_device(config.device).type != "cuda":
            raise ValueError("dist_backend='nccl' needs CUDA devices: use dist_backend='gloo' "
                             "on the CPU")
        return config.dist_backend
    return "nccl" if resolve_device(config.device).type == "cuda" else "gloo"


def pool_pages(config: EngineConfig, bytes_per_token: int, device: torch.device) -> int:
    """KV pool size in pages: an explicit max_total_tokens, or mem_fraction of free memory
    (capped on the CPU, whose memory everything else on the machine shares)."""
    if config.max_total_tokens is not None:
        tokens = config.max_total_tokens
    else:
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
        else:
            free = psutil.virtual_memory().available
        tokens = pool_tokens(free, config.mem_fraction, bytes_per_token)
        if device.type == "cpu":
            tokens = min(tokens, CPU_MAX_POOL_TOKENS)
    return max(tokens // config.page_size, 2)


def tier_pages(config: EngineConfig, num_pages: int, per_token: int, tp: TPGroup
               ) -> tuple[int, int]:
    """The host and disk KV tiers' pages (0: off); --enable-hierarchical-cache sizes the host
    tier from the pool where --host-cache-tokens does not, and a disk directory without
    --disk-cache-tokens is sized from its free space (auto_disk_pages; the ranks take the
    smallest of their sizes). Every rank calls this together."""
    if config.disable_radix_cache:
        return 0, 0  # nothing is cached, so nothing is tiered
    ps = config.page_size
    host = config.host_cache_tokens // ps
    if not host and config.enable_hierarchical_cache:
        host = min(int(num_pages * HICACHE_HOST_RATIO), MAX_TIER_TOKENS // ps)
    disk = config.disk_cache_tokens // ps
    if config.disk_cache_dir and not disk:
        local_ranks = config.tp_size // config.nnodes
        disk = tp.min_int(min(auto_disk_pages(config.disk_cache_dir, tp.rank, local_ranks, ps,
                                              per_token * ps), MAX_TIER_TOKENS // ps))
        log.info("disk KV tier: %d tokens (%.2f GiB on each of %d rank(s)) in %s, sized from "
                 "its free space (%.0f%%, at most %.0f GiB per machine; --disk-cache-tokens "
                 "sets it)", disk * ps, disk * ps * per_token / (1 << 30), tp.size,
                 config.disk_cache_dir, 100 * DISK_TIER_FREE_FRACTION,
                 DISK_TIER_AUTO_MAX_BYTES / (1 << 30))
    return host, disk


def build_tiers(config: EngineConfig, loaded: LoadedModel, worker: Worker, tp: TPGroup,
                host_pages: int, disk_pages: int, per_token: int) -> KVTiers:
    """The worker's host buffer and disk file (this rank's) beside its pool; a host tier the
    host's available memory cannot hold is refused."""
    host_bytes = host_pages * config.page_size * per_token
    available = psutil.virtual_memory().available
    if host_bytes > HOST_TIER_MAX_FRACTION * available:
        raise ValueError(f"the host KV tier ({host_pages * config.page_size} tokens) needs "
                         f"{host_bytes / (1 << 30):.2f} GiB of host memory on this rank; "
                         f"{available / (1 << 30):.2f} GiB are available: lower "
                         "host_cache_tokens")
    disk = None
    if disk_pages:
        assert config.disk_cache_dir is not None
        model = model_fingerprint(loaded.model_path, loaded.gguf_file,
                                  config.load_format == "dummy")
        geometry = Geometry(config.page_size, per_token * config.page_size, disk_pages)
        disk = DiskFile(config.disk_cache_dir, tp.rank, geometry,
                        fingerprint(model, worker.dtype, worker.kv_cache, config.page_size,
                                    tp.rank, tp.size), write_names=tp.rank == 0)
    return KVTiers(worker.kv_cache, config.page_size, host_pages, disk)


def build_worker(
    config: EngineConfig,
    loaded: LoadedModel | None = None,
    grammars: GrammarCompiler | None = None,
    grammar_dir: str | None = None,
    tp: TPGroup | None = None,
) -> tuple[Worker, WorkerReady]:
    """Load the model (or reuse `loaded`, whose device and dtype then win), size the KV pool
    and build the worker. grammars / grammar_dir: see Worker. tp: this rank's group under
    tensor parallelism (every rank calls this together: the pool size is agreed, the minimum
    of the ranks')."""
    tp = tp or TPGroup.single()
    if loaded is None:
        device = rank_device(config, tp.rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dtype = resolve_dtype(config.dtype, device)
        loaded = load_model(
            config.model,
            dtype=dtype,
            device=device,
            load_format=config.load_format,
            context_length=config.context_length,
            attention_backend=resolve_attention_backend(config.attention_backend, device),
            tp=tp,
            weight_format=config.weight_format,
            quantization=config.quantization,
        )
    elif loaded.model.tp.size != tp.size:
        raise ValueError("a LoadedModel is shared only at its own tp_size: under tensor "
                         "parallelism each rank loads its shard (pass the model's path)")
    param = next(loaded.model.parameters())
    device, dtype = param.device, param.dtype
    shard = loaded.model.shard
    per_token = kv_bytes_per_token(shard.kv_shape(loaded.config),
                                   torch.empty((), dtype=dtype).element_size())
    shapes, max_rank, lora = None, 0, None
    if config.lora_enabled:  # its slots first: the pool is sized from the memory left
        if loaded.config.kv_lora_rank:
            raise ValueError(f"{loaded.config.architecture} has latent attention, which LoRA "
                             "adapters do not reach here (their q/k/v/o targets): serve it "
                             "without --lora-paths / --enable-lora")
        shapes = lora_shapes(loaded.config)
        max_rank = lora_rank(config, shapes)
        lora = LoraManager(loaded.model, shapes, config.max_loras_per_batch, max_rank,
                           config.max_loaded_loras)
    num_pages = tp.min_int(pool_pages(config, per_token, device))
    host_pages, disk_pages = tier_pages(config, num_pages, per_token, tp)
    worker = Worker(
        loaded,
        num_pages * config.page_size,
        seed=config.seed,
        # graphs are captured per rank without the collectives: eager under tensor parallelism
        cuda_graph_max_bs=config.cuda_graph_max_bs if tp.size == 1 else 0,
        grammars=grammars,
        jump_forward=not config.disable_jump_forward,
        grammar_dir=grammar_dir,
        grammar_backend=config.grammar_backend,
        grammar_compile_timeout=config.grammar_compile_timeout,
    )
    if host_pages or disk_pages:
        worker.tiers = build_tiers(config, loaded, worker, tp, host_pages, disk_pages, per_token)
    worker.lora = lora
    ready = WorkerReady(
        num_pages=num_pages,
        page_size=config.page_size,
        context_length=context_length_for(config, loaded.config),
        vocab_size=loaded.config.vocab_size,
        eos_token_ids=list(loaded.config.eos_token_ids),
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        kv_bytes_per_token=per_token * tp.size,
        host_pages=host_pages,
        disk_pages=disk_pages,
        tp=None if tp.size == 1 else TPLayout(
            **shard.describe(loaded.config), kv_bytes_per_token_per_rank=per_token,
            nnodes=config.nnodes, backend=dist_backend(config)),
        weight_formats=loaded.model.weight_formats(),
        cpu=CpuCompute(torch.get_num_threads(), loaded.model.cpu_kernels, openmp_wait())
        if device.type == "cpu" else None,
        lora_shapes=shapes,
        lora_max_rank=max_rank,
        pooling=read_pooling_info(None if loaded.gguf_file else loaded.model_path,
                                  loaded.config, config.task, loaded.tokenizer,
                                  loaded.model.generates, loaded.gguf_pooling),
        takes_images=loaded.vision is not None,
        image_blocks=loaded.vision is not None and loaded.vision.bidirectional,
    )
    return worker, ready


def lora_shapes(cfg: ModelConfig) -> LoraModuleShapes:
    """The projections of the decoder `cfg` describes that LoRA adapters may adapt."""
    dense = [i for i, moe in enumerate(cfg.moe_kinds) if not moe]
    return module_shapes(cfg.hidden_size, cfg.num_heads * cfg.head_dim,
                         cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size, dense,
                         cfg.num_layers)


def lora_rank(config: EngineConfig, shapes: LoraModuleShapes) -> int:
    """--max-lora-rank, or the largest rank of --lora-paths' adapters (DEFAULT_MAX_LORA_RANK
    without any)."""
    if config.max_lora_rank:
        return config.max_lora_rank
    ranks = [read_spec(path, shapes, MAX_LORA_RANK, digest=False).rank
             for path in config.lora_adapters().values()]
    return max(ranks, default=DEFAULT_MAX_LORA_RANK)
