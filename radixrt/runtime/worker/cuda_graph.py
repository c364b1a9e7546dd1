"""CudaGraphRunner: decode steps replayed from CUDA graphs, one graph per batch-size bucket.

A small model's decode step is a few hundred tiny kernel launches; replaying them as one graph
removes the launch overhead. Graphs bake in tensor addresses, so every input of the step lives in
a static buffer that replay() fills: token ids, positions, output slots, kv_indptr, and kv_indices
(a buffer of kv_capacity entries). A batch of bs requests runs the graph of the smallest bucket
>= bs; the extra rows are dummy requests of one position each, all on the KV pool's padding slot
(so the padding slot holds their K/V: finite values that nothing reads unmasked). Prefill and
mixed batches, batches larger than the largest bucket, or with more KV positions than the buffer
holds, run eagerly (run() returns None for them).
"""

from __future__ import annotations

import torch
from torch import Tensor

from radixrt.kernels.decode_attention import decode_workspace_numel, default_num_kv_splits
from radixrt.kernels.mla_attention import mla_head_blocks
from radixrt.kernels.triton_utils import interpreting
from radixrt.runtime.forward.attention.triton_backend import TritonAttentionBackend
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models.decoder import CausalLM

# On CUDA a decode batch that a CUDA graph can replay runs the graph (plain decode attention)
# unless its groups save at least this many reads per layer; then it runs eagerly with the
# cascade kernel. Not yet measured on a GPU (benchmarks/gpu_check.py times the kernels).
CASCADE_GRAPH_MIN_SAVED_READS = 8192

SMALL_BATCH_SIZES = (1, 2, 4, 8)  # buckets below BATCH_SIZE_STEP
BATCH_SIZE_STEP = 16  # buckets from here on are multiples of this (plus max_bs itself)
KV_CAPACITY_PER_SLOT = 4  # kv_indices buffer: this many entries per pool slot (prefix sharing)
WARMUP_RUNS = 2  # eager runs before each capture (Triton compiles on the first)


def graph_batch_sizes(max_bs: int) -> list[int]:
    """Buckets 1, 2, 4, 8, 16, 32, ... up to and including max_bs."""
    sizes = {b for b in SMALL_BATCH_SIZES if b <= max_bs}
    sizes.update(range(BATCH_SIZE_STEP, max_bs + 1, BATCH_SIZE_STEP))
    sizes.add(max_bs)
    return sorted(sizes)


def supports_cuda_graphs(model: CausalLM, device: torch.device) -> bool:
    """Graphs need compiled Triton kernels on a CUDA device (not the interpreter)."""
    backend = model.attn_backend
    triton_backend = isinstance(backend, TritonAttentionBackend)
    return device.type == "cuda" and triton_backend and not interpreting()


class CudaGraphRunner:
    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVCache,
        max_bs: int,
        kv_capacity: int | None = None,
    ) -> None:
        if not supports_cuda_graphs(model, kv_cache.device):
            raise ValueError("CUDA graphs need a CUDA device and the triton attention backend")
        if max_bs < 1:
            raise ValueError(f"max_bs={max_bs} must be >= 1")
        self.model = model
        self.backend: TritonAttentionBackend = model.attn_backend  # type: ignore[assignment]
        self.kv_cache = kv_cache
        self.batch_sizes = graph_batch_sizes(max_bs)
        self.max_bs = self.batch_sizes[-1]
        self.kv_capacity = kv_capacity or KV_CAPACITY_PER_SLOT * kv_cache.num_slots + self.max_bs
        device, pad = kv_cache.device, kv_cache.padding_slot
        i64 = dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(self.max_bs, **i64)  # [max_bs]
        self.positions = torch.zeros(self.max_bs, **i64)  # [max_bs]
        self.out_slots = torch.full((self.max_bs,), pad, **i64)  # [max_bs]
        self.arange = torch.arange(self.max_bs + 1, **i64)  # [max_bs + 1]
        self.qo_indptr = self.arange.clone()  # [max_bs + 1]: one new token per request
        self.kv_indptr = self.arange.clone()  # [max_bs + 1]
        self.kv_indices = torch.full((self.kv_capacity,), pad, **i64)  # [kv_capacity]
        config = model.config
        # programs per request and split: KV heads, or a latent layer's blocks of query heads;
        # the partial outputs' width: a head's, or the latent's
        programs = (mla_head_blocks(config.num_heads) if config.kv_lora_rank
                    else config.num_kv_heads)
        width = config.kv_lora_rank or config.head_dim
        # graphs serve every context length, so the split count assumes long ones
        self.num_kv_splits = {
            bs: default_num_kv_splits(bs, programs, device) for bs in self.batch_sizes
        }
        numel = max(
            decode_workspace_numel(bs, config.num_heads, width, self.num_kv_splits[bs])
            for bs in self.batch_sizes
        )
        self.workspace = torch.empty(max(numel, 1), dtype=torch.float32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Tensor] = {}  # bucket -> [bucket, hidden] static output
        self.replays = 0
        self.capture()

    def _static_batch(self, bs: int) -> ForwardBatch:
        """Views of the static buffers as a decode batch of bs requests (the Python lists only
        mark it decode-only; the kernels read the tensors)."""
        return ForwardBatch(
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            out_slots=self.out_slots[:bs],
            qo_indptr=self.qo_indptr[: bs + 1],
            kv_indptr=self.kv_indptr[: bs + 1],
            kv_indices=self.kv_indices,
            seq_lens=[2] * bs,
            extend_lens=[1] * bs,
        )

    @torch.no_grad()
    def capture(self) -> None:
        """Capture every bucket, largest first, all sharing one memory pool."""
        device = self.kv_cache.device
        stream = torch.cuda.Stream(device)
        pool = None
        for bs in reversed(self.batch_sizes):
            batch = self._static_batch(bs)
            self.backend.enter_graph_mode(self.num_kv_splits[bs], self.workspace)
            try:
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    for _ in range(WARMUP_RUNS):
                        self.model(batch, self.kv_cache)
                torch.cuda.current_stream(device).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    out = self.model(batch, self.kv_cache)  # [bs, hidden]
            finally:
                self.backend.exit_graph_mode()
            pool = graph.pool()
            self.graphs[bs] = graph
            self.outputs[bs] = out
        torch.cuda.synchronize(device)

    def bucket_for(self, batch: ForwardBatch) -> int | None:
        """The bucket that replays this batch, or None when it must run eagerly."""
        bs = batch.batch_size
        if bs == 0 or bs > self.max_bs or not batch.is_decode_only or batch.lora is not None:
            return None  # (the graphs were captured without LoRA products)
        if (batch.shared_reads_saved >= CASCADE_GRAPH_MIN_SAVED_READS
                and not self.model.config.kv_lora_rank):  # (latent layers have no cascade kernel)
            return None  # worth the cascade kernel, eagerly (the graph ignores prefix groups)
        bucket = next(b for b in self.batch_sizes if b >= bs)
        if batch.kv_indices.numel() + bucket - bs > self.kv_capacity:
            return None
        return bucket

    def run(self, batch: ForwardBatch) -> Tensor | None:
        """[bs, hidden] final hidden states of a decode batch (valid until the next run), or
        None when the batch has no graph (the caller runs the model eagerly)."""
        bucket = self.bucket_for(batch)
        if bucket is None:
            return None
        bs, n_kv, pad = batch.batch_size, batch.kv_indices.numel(), self.kv_cache.padding_slot
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)
        self.out_slots[:bs].copy_(batch.out_slots)
        self.kv_indptr[: bs + 1].copy_(batch.kv_indptr)
        self.kv_indices[:n_kv].copy_(batch.kv_indices)
        if bucket > bs:  # dummy requests: token 0 at position 0, one position, the padding slot
            self.input_ids[bs:bucket].zero_()
            self.positions[bs:bucket].zero_()
            self.out_slots[bs:bucket].fill_(pad)
            self.kv_indptr[bs + 1 : bucket + 1].copy_(self.arange[1 : bucket - bs + 1] + n_kv)
            self.kv_indices[n_kv : n_kv + bucket - bs].fill_(pad)
        self.graphs[bucket].replay()
        self.replays += 1
        return self.outputs[bucket][:bs]
