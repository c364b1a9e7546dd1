"""The CPU's decode-step attention kernels (kernels/cpu/attention.cpp), each with the signature
of its PyTorch reference and its arguments checked before a pointer crosses to C:

    decode_attention_cpu   decode_attention_ref    (kernels/reference.py), plus lse
    store_kv_cpu           store_kv_ref            (kernels/reference.py)
    rotate_qk_cpu          apply_rotary on q and k (models/rope.py), in place

cpu_kernels_apply(...) says whether tensors suit them (float32 CPU tensors laid out as the
kernels read them); callers take the reference otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

from radixrt.kernels.native import NativeUnavailable, native_library

MAX_HEAD_DIM = 256  # kernels/cpu/attention.cpp's stack buffers
MAX_GROUP = 64


def native_available() -> bool:
    try:
        native_library()
    except NativeUnavailable:
        return False
    return True


def cpu_kernels_apply(*tensors: Tensor) -> bool:
    """float32 tensors on the CPU, the kernels built: the CPU kernels can take them."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and native_available())


def _rows(t: Tensor) -> bool:
    """[T, heads, D] with heads and D contiguous (any token stride)."""
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]


def decode_attention_cpu(
    q: Tensor, o: Tensor, k_cache: Tensor, v_cache: Tensor, kv_indptr: Tensor,
    kv_indices: Tensor, sm_scale: float, *, sliding_window: int | None = None,
    logit_cap: float = 0.0, sinks: Tensor | None = None, lse: Tensor | None = None,
    qo_indptr: Tensor | None = None,
) -> bool:
    """decode_attention_ref into o (and the log-sum-exps without the sinks into lse [rows,
    heads] if given); with qo_indptr, extend_attention_ref's rows instead (request i's new
    tokens are rows qo_indptr[i]:qo_indptr[i + 1], each seeing its request's KV up to its own
    position). The slots are checked by the caller (slots_within); False (nothing written)
    where the shapes are outside the kernel's."""
    rows, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    if (dim % 16 or dim > MAX_HEAD_DIM or heads % kv_heads or heads // kv_heads > MAX_GROUP
            or not (q.is_contiguous() and o.is_contiguous() and k_cache.is_contiguous()
                    and v_cache.is_contiguous())):
        return False
    if rows == 0:
        return True
    indptr = kv_indptr.to(torch.int64).contiguous()
    indices = kv_indices.to(torch.int64).contiguous()
    qo = None if qo_indptr is None else qo_indptr.to(torch.int64).contiguous()
    requests = indptr.numel() - 1
    if qo is not None and (qo.numel() != requests + 1 or int(qo[-1]) != rows):
        raise ValueError(f"qo_indptr of {qo.numel()} entries for {requests} requests, "
                         f"{rows} query rows")
    if sinks is not None:
        sinks = sinks.float().contiguous()
    if lse is not None and (tuple(lse.shape) != (rows, heads) or not lse.is_contiguous()):
        raise ValueError(f"lse of shape {tuple(lse.shape)}: expected a contiguous "
                         f"[{rows}, {heads}]")
    status = native_library().rx_decode_attention(
        q.data_ptr(), o.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        None if qo is None else qo.data_ptr(), indptr.data_ptr(), indices.data_ptr(), requests,
        heads, kv_heads, dim, sm_scale, sliding_window or 0, logit_cap,
        None if sinks is None else sinks.data_ptr(), None if lse is None else lse.data_ptr())
    return status == 0


def slots_within(slots: Tensor, num_slots: int) -> bool:
    """Every slot in [0, num_slots): what the caller checks once per forward pass before the
    kernels read or write through the slots (they index memory unchecked)."""
    return slots.numel() == 0 or (int(slots.min()) >= 0 and int(slots.max()) < num_slots)


def store_kv_cpu(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, out_slots: Tensor
                 ) -> bool:
    """store_kv_ref, the slots checked by the caller (slots_within); False (nothing written)
    where the layout is not the kernel's."""
    if not (_rows(k) and _rows(v) and k_cache.is_contiguous() and v_cache.is_contiguous()
            and tuple(k.shape[1:]) == tuple(k_cache.shape[1:]) == tuple(v.shape[1:])):
        return False
    slots = out_slots.to(torch.int64).contiguous()
    if slots.numel() != k.shape[0]:
        raise ValueError(f"{slots.numel()} slots for {k.shape[0]} tokens")
    row = k_cache.shape[1] * k_cache.shape[2]
    native_library().rx_store_kv(k_cache.data_ptr(), v_cache.data_ptr(), k.data_ptr(),
                                 v.data_ptr(), k.stride(0), v.stride(0), slots.data_ptr(),
                                 slots.numel(), row)
    return True


def rotate_qk_cpu(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), in place (q [T, heads, D],
    k [T, kv_heads, D]; cos, sin [T, 1, rotary_dim // 2]); False (nothing changed) where the
    layout is not the kernel's."""
    cos2, sin2 = cos.reshape(cos.shape[0], -1), sin.reshape(sin.shape[0], -1)
    half = cos2.shape[1]
    if not (_rows(q) and _rows(k) and cos2.is_contiguous() and sin2.is_contiguous()
            and q.shape[0] == k.shape[0] == cos2.shape[0] and 2 * half <= q.shape[2]
            and q.shape[2] == k.shape[2]):
        return False
    native_library().rx_rotate_qk(q.data_ptr(), q.stride(0), q.shape[1], k.data_ptr(),
                                  k.stride(0), k.shape[1], q.shape[2], cos2.data_ptr(),
                                  sin2.data_ptr(), q.shape[0], 2 * half)
    return True
