"""PyTorch references of the batched LoRA products (the SGMV idea of Punica / S-LoRA): many
adapters applied in one forward pass, each row of the batch through its own adapter's matrices.

A layer with LoRA computes, for every row x_i of the batch whose request uses adapter s,

    y_i += scale_s * x_i A_s^T B_s^T        A_s [r_s, K] (down), B_s [N, r_s] (up)

in two products: the shrink t_i = x_i A_s^T (rank r_s) and the expand y_i += t_i B_s^T. The
scale (alpha / r) is folded into B by the caller. The adapters loaded at a time sit in S slots,
stacked and zero-padded to a common rank R: a [S, R, K], b [S, N, R] (the padded rows of A and
columns of B are zeros, so they add nothing). Rows are grouped in segments of consecutive rows
sharing a slot (one request's tokens): seg_indptr [G+1] (int64; segment g is rows
seg_indptr[g]:seg_indptr[g+1], the segments cover rows 0..T in order) and seg_slot [G] (int64, the
segment's slot, -1 for none: its rows get no LoRA term).

    sgmv_shrink_ref  t = x A^T per segment          (Triton: lora_triton.sgmv_shrink)
    sgmv_expand_ref  y += t B^T per segment         (Triton: lora_triton.sgmv_expand)
    lora_dense_ref   both at once without a loop over segments (decode's one row per request)
    segments_of      the run-length segments of a per-row slot vector

Products accumulate in float32; t is float32, y keeps its dtype (its sum rounded once).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_segments(seg_indptr: Tensor, seg_slot: Tensor) -> None:
    """seg_indptr [G+1] and seg_slot [G], one-dimensional (their values are not checked: that
    would cost the GPU path a host synchronisation)."""
    if seg_indptr.dim() != 1 or seg_slot.dim() != 1 or seg_indptr.numel() != seg_slot.numel() + 1:
        raise ValueError(f"expected seg_indptr [G+1] and seg_slot [G], got "
                         f"{tuple(seg_indptr.shape)} and {tuple(seg_slot.shape)}")  # fmt: skip


def check_shrink_args(x: Tensor, a: Tensor, seg_indptr: Tensor, seg_slot: Tensor) -> None:
    """x [T, K], a [S, R, K] and the segments fit together (shared by the Triton launcher)."""
    if x.dim() != 2 or a.dim() != 3 or a.shape[2] != x.shape[1]:
        raise ValueError(f"expected x [T, K] and a [S, R, K], got {tuple(x.shape)} and "
                         f"{tuple(a.shape)}")  # fmt: skip
    _check_segments(seg_indptr, seg_slot)


def check_expand_args(t: Tensor, b: Tensor, seg_indptr: Tensor, seg_slot: Tensor,
                      y: Tensor) -> None:  # fmt: skip
    """t [T, R], b [S, N, R], y [T, N] and the segments fit together."""
    if t.dim() != 2 or b.dim() != 3 or y.dim() != 2:
        raise ValueError("expected t [T, R], b [S, N, R] and y [T, N]")
    if b.shape[2] != t.shape[1] or tuple(y.shape) != (t.shape[0], b.shape[1]):
        raise ValueError(f"t {tuple(t.shape)}, b {tuple(b.shape)} and y {tuple(y.shape)} do not "
                         "fit together")  # fmt: skip
    _check_segments(seg_indptr, seg_slot)


def sgmv_shrink_ref(x: Tensor, a: Tensor, seg_indptr: Tensor, seg_slot: Tensor) -> Tensor:
    """x [T, K], a [S, R, K] -> t [T, R] float32: x[rows] @ a[slot].T for each segment's rows,
    zeros for the rows of segments with slot -1. Only the slots segments name are read."""
    check_shrink_args(x, a, seg_indptr, seg_slot)
    t = torch.zeros(x.shape[0], a.shape[1], dtype=torch.float32, device=x.device)
    bounds, slots = seg_indptr.tolist(), seg_slot.tolist()
    for g, slot in enumerate(slots):
        lo, hi = bounds[g], bounds[g + 1]
        if slot >= 0 and hi > lo:
            t[lo:hi] = x[lo:hi].float() @ a[slot].float().T
    return t


def sgmv_expand_ref(t: Tensor, b: Tensor, seg_indptr: Tensor, seg_slot: Tensor,
                    y: Tensor) -> Tensor:  # fmt: skip
    """t [T, R], b [S, N, R], y [T, N]: y[rows] += t[rows] @ b[slot].T for each segment (the sum
    in float32, rounded to y's dtype once), in place; rows of slot -1 are untouched (their t is
    not read). Returns y."""
    check_expand_args(t, b, seg_indptr, seg_slot, y)
    bounds, slots = seg_indptr.tolist(), seg_slot.tolist()
    for g, slot in enumerate(slots):
        lo, hi = bounds[g], bounds[g + 1]
        if slot >= 0 and hi > lo:
            y[lo:hi] = (y[lo:hi].float() + t[lo:hi].float() @ b[slot].float().T).to(y.dtype)
    return y


def lora_dense_ref(x: Tensor, a: Tensor, b: Tensor, token_slot: Tensor, y: Tensor) -> Tensor:
    """x [T, K], a [S, R, K], b [S, N, R], token_slot [T] (each row's slot, -1 for none), y [T, N]:
    y += the LoRA term of each row, in place, as two dense products over all slots at once (no
    loop over segments, for many short segments such as decode's one row per request):

        t = x @ a.reshape(S * R, K).T                    [T, S * R]
        t = t masked to each row's own slot's R columns  (a one-hot mask from token_slot)
        y += t @ b.permute(1, 0, 2).reshape(N, S * R).T  [T, N]

    Equal to sgmv_shrink_ref then sgmv_expand_ref on segments_of(token_slot), but it reads every
    slot's weights: they must all be finite (a masked zero times a NaN of B is NaN). Returns y."""
    seg_indptr, seg_slot = token_slot.new_zeros(1), token_slot.new_zeros(0)  # shapes only
    check_shrink_args(x, a, seg_indptr, seg_slot)
    check_expand_args(torch.empty(x.shape[0], a.shape[1], device="meta"), b, seg_indptr, seg_slot,
                      y)  # fmt: skip
    num_slots, rank, k = a.shape
    if b.shape[0] != num_slots or tuple(token_slot.shape) != (x.shape[0],):
        raise ValueError(f"b {tuple(b.shape)} and token_slot {tuple(token_slot.shape)} do not fit "
                         f"a {tuple(a.shape)} and x {tuple(x.shape)}")  # fmt: skip
    n = b.shape[1]
    own = slot_columns(token_slot.to(x.device), num_slots, rank)  # [T, S * R]
    b_all = b.permute(1, 0, 2).reshape(n, num_slots * rank).float()  # [N, S * R]
    out = lora_dense(x.float(), a.reshape(num_slots * rank, k).float(), b_all, own, y.float())
    y.copy_(out.to(y.dtype))
    return y


def slot_columns(token_slot: Tensor, num_slots: int, rank: int) -> Tensor:
    """[T, S * R] float32: 1.0 where column j (slot j // R) is row i's slot, else 0.0."""
    column_slot = torch.arange(num_slots * rank, device=token_slot.device) // rank
    return (column_slot[None, :] == token_slot.long()[:, None]).float()


def lora_dense(x: Tensor, a_flat: Tensor, b_flat: Tensor, own: Tensor, y: Tensor) -> Tensor:
    """lora_dense_ref's products on matrices laid out for them (the CPU path keeps its slots
    so): x [T, K], a_flat [S * R, K] (a.reshape), b_flat [N, S * R] (b.permute(1, 0, 2)
    .reshape), own [T, S * R] (slot_columns), y [T, N], all one dtype; y += in place:

        y += ((x @ a_flat.T) * own) @ b_flat.T

    Returns y."""
    t = x @ a_flat.T  # [T, S * R]
    t.mul_(own)
    return y.addmm_(t, b_flat.T)


def segment_rows(seg_indptr: Tensor, seg_slot: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The segments with an adapter as a padded table for lora_padded: (rows [G', L] int64,
    each segment's row indices, padded with T: a zero row; slots [G'] int64; valid [G' * L]
    bool, the entries that are rows). L is the longest segment."""
    bounds, slots = seg_indptr.tolist(), seg_slot.tolist()
    total = bounds[-1] if bounds else 0
    kept = [(bounds[g], bounds[g + 1], s) for g, s in enumerate(slots)
            if s >= 0 and bounds[g + 1] > bounds[g]]
    longest = max((hi - lo for lo, hi, _ in kept), default=0)
    rows = torch.full((len(kept), longest), total, dtype=torch.int64)
    for i, (lo, hi, _) in enumerate(kept):
        rows[i, : hi - lo] = torch.arange(lo, hi)
    valid = (rows != total).reshape(-1)
    slot_t = torch.tensor([s for _, _, s in kept], dtype=torch.int64)
    device = seg_indptr.device
    return rows.to(device), slot_t.to(device), valid.to(device)


def lora_padded(x: Tensor, a: Tensor, b: Tensor, rows: Tensor, slots: Tensor, valid: Tensor,
                y: Tensor) -> Tensor:
    """sgmv_shrink_ref then sgmv_expand_ref as two batched products over the segments padded to
    the longest (segment_rows' table), for prefill's long segments: a handful of operations
    whatever the number of segments. x [T, K], a [S, R, K], b [S, N, R], y [T, N] (one dtype);
    y += in place; returns y."""
    if rows.numel() == 0:
        return y
    g, length = rows.shape
    padded = torch.cat([x, x.new_zeros(1, x.shape[1])])[rows]  # [G', L, K]
    t = torch.bmm(padded, a[slots].transpose(1, 2))  # [G', L, R]
    u = torch.bmm(t, b[slots].transpose(1, 2))  # [G', L, N]
    flat = rows.reshape(-1)[valid]
    return y.index_add_(0, flat, u.reshape(g * length, -1)[valid])


def segments_of(token_slot: Tensor) -> tuple[Tensor, Tensor]:
    """token_slot [T] -> (seg_indptr [G+1], seg_slot [G]), both int64: the runs of equal
    consecutive slots (G = 0 and seg_indptr = [0] for T = 0)."""
    if token_slot.dim() != 1:
        raise ValueError(f"token_slot {tuple(token_slot.shape)}: expected [T]")
    seg_slot, counts = torch.unique_consecutive(token_slot.long(), return_counts=True)
    seg_indptr = torch.zeros(seg_slot.numel() + 1, dtype=torch.int64, device=token_slot.device)
    seg_indptr[1:] = counts.cumsum(0)
    return seg_indptr, seg_slot
