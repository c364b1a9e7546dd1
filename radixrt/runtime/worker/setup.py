"""The one worker factory: device and dtype, the attention backend, the model, the KV pool's
size, and the `WorkerReady` report the scheduler is sized from. The Engine and the worker process
both build their worker here, so both run the same model on the same pool."""

from __future__ import annotations

import psutil
import torch

from radixrt.runtime.config import CPU_MAX_POOL_TOKENS, EngineConfig
from radixrt.runtime.constrained.compiler import GrammarCompiler
from radixrt.runtime.forward.attention import resolve_attention_backend
from radixrt.runtime.messages import WorkerReady
from radixrt.runtime.models.loader import LoadedModel, inspect_model, load_model, resolve_dtype
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.worker.capacity import kv_bytes_per_token, pool_tokens
from radixrt.runtime.worker.worker import Worker


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
    """The context length the runtime serves: config.context_length, else the model's. Refused
    past the model's positions, and past a sliding window (attention here is full: exact only
    within the window)."""
    length = config.context_length or model.max_position_embeddings
    if length > model.max_position_embeddings:
        raise ValueError(f"context_length={length} exceeds the model's "
                         f"{model.max_position_embeddings} positions: use "
                         f"context_length={model.max_position_embeddings} or less")
    window = model.sliding_window
    if window is not None and length > window:
        raise ValueError(f"the model attends over a sliding window of {window} tokens, which "
                         f"radixrt does not implement (full attention is exact only within the "
                         f"window): use context_length={window} or less")
    return length


def check_config(config: EngineConfig) -> None:
    """What build_worker would refuse, found without loading weights (the server checks it
    before it starts any process): the model, the device, the context length."""
    context_length_for(config, inspect_model(config.model))
    resolve_device(config.device)


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


def build_worker(
    config: EngineConfig,
    loaded: LoadedModel | None = None,
    grammars: GrammarCompiler | None = None,
    grammar_dir: str | None = None,
) -> tuple[Worker, WorkerReady]:
    """Load the model (or reuse `loaded`, whose device and dtype then win), size the KV pool
    and build the worker. grammars / grammar_dir: see Worker."""
    if loaded is None:
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        loaded = load_model(
            config.model,
            dtype=dtype,
            device=device,
            load_format=config.load_format,
            attention_backend=resolve_attention_backend(config.attention_backend, device),
        )
    param = next(loaded.model.parameters())
    device, dtype = param.device, param.dtype
    per_token = kv_bytes_per_token(loaded.config, torch.empty((), dtype=dtype).element_size())
    num_pages = pool_pages(config, per_token, device)
    worker = Worker(
        loaded,
        num_pages * config.page_size,
        seed=config.seed,
        cuda_graph_max_bs=config.cuda_graph_max_bs,
        grammars=grammars,
        jump_forward=not config.disable_jump_forward,
        grammar_dir=grammar_dir,
    )
    ready = WorkerReady(
        num_pages=num_pages,
        page_size=config.page_size,
        context_length=context_length_for(config, loaded.config),
        vocab_size=loaded.config.vocab_size,
        eos_token_ids=list(loaded.config.eos_token_ids),
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        kv_bytes_per_token=per_token,
    )
    return worker, ready
