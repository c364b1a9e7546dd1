"""Attention backends: the protocol and the implementations, chosen by name."""

from __future__ import annotations

import torch

from radixrt.runtime.forward.attention.base import AttentionBackend
from radixrt.runtime.forward.attention.torch_backend import TorchAttentionBackend

ATTENTION_BACKEND_NAMES = ("torch", "triton")


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """The one "auto" rule: triton on CUDA, torch elsewhere; other names pass through."""
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return name


def create_attention_backend(name: str) -> AttentionBackend:
    """A fresh backend by name ("torch" or "triton"; see resolve_attention_backend for "auto")."""
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        from radixrt.runtime.forward.attention.triton_backend import (  # type: ignore[import-not-found]
            TritonAttentionBackend,
        )

        return TritonAttentionBackend()
    raise ValueError(f"attention_backend={name!r} is invalid: use one of {ATTENTION_BACKEND_NAMES}")


__all__ = [
    "ATTENTION_BACKEND_NAMES",
    "AttentionBackend",
    "TorchAttentionBackend",
    "create_attention_backend",
    "resolve_attention_backend",
]
