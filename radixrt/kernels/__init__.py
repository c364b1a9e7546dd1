"""Attention kernels on the paged KV pool: Triton kernels and their PyTorch references.

    store_kv          radixrt/kernels/store_kv.py          reference: store_kv_ref
    extend_attention  radixrt/kernels/extend_attention.py  reference: extend_attention_ref
    decode_attention  radixrt/kernels/decode_attention.py  reference: decode_attention_ref
    cascade_decode_attention
                      radixrt/kernels/cascade_attention.py reference: cascade_decode_attention_ref

Each Triton launcher takes the arguments of its reference (radixrt/kernels/reference.py) plus
optional tuning keywords; import it from its module. Triton decides at `@triton.jit` time (when a
kernel module is imported) whether kernels run on the GPU or in its CPU interpreter, so on a
machine without CUDA this package turns the interpreter on before any kernel module is imported,
unless TRITON_INTERPRET is already set. Importing this package or the references never imports
Triton.
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
