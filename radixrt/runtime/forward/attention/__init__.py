"""Attention backends: the protocol and the implementations, chosen by name."""

from __future__ import annotations

from radixrt.runtime.forward.attention.base import AttentionBackend
from radixrt.runtime.forward.attention.torch_backend import TorchAttentionBackend

ATTENTION_BACKEND_NAMES = ("torch", "triton")


def create_attention_backend(name: str) -> AttentionBackend:
    """A fresh backend by name ("torch" or "triton"; "auto" is resolved by the engine)."""
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
]
