"""VisionEncoder: what every vision family's tower + projector offers the worker.

`encode(tensors)` takes one image's tensors as its processor made them (tokenizer/
image_prompts.py: pixel_values, and image_sizes / pixel_attention_mask / image_grid_thw where
the family has them, each with the processor's leading batch dimension of 1) and returns its
features, [num_placeholders, decoder hidden], in the order of the image's placeholder tokens.

The towers are transformers' own vision modules, built from the checkpoint's vision_config and
loaded with its weights (they run once per image, and their output is cached by the image's
digest: worker/image_embeds.py); the projectors, which decide what the decoder sees, are ours.
Each family names the checkpoint prefixes of its tower and projector (`weight_prefixes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn


def transformers_config(cfg: Mapping[str, Any]) -> Any:
    """A transformers config object of a config dict (its model_type's class)."""
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[cfg["model_type"]].from_dict(dict(cfg))


class VisionEncoder(nn.Module):
    """Subclasses set `weight_prefixes`: checkpoint prefix -> our module prefix."""

    weight_prefixes: tuple[tuple[str, str], ...] = ()
    # an image's rows attend to each other both ways (Gemma 3): the decoder computes a run
    # in one chunk (scheduler/image_blocks.py), each row seeing up to its run's last position
    bidirectional = False

    def encode(self, tensors: Mapping[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def position_grid(self, tensors: Mapping[str, Tensor]) -> tuple[int, int, int]:
        """The merged grid (t, h, w) of an image's rows, for a decoder with multimodal RoPE
        (worker/image_positions.py); families without it have none."""
        raise NotImplementedError(f"{type(self).__name__} has no multimodal RoPE grid")

    def target(self, name: str) -> str | None:
        """Our parameter name of checkpoint tensor `name`, or None (not this encoder's)."""
        for prefix, ours in self.weight_prefixes:
            if name.startswith(prefix):
                return ours + name.removeprefix(prefix)
        return None

    @torch.no_grad()
    def load(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Load (our name, tensor) pairs; every parameter must be covered exactly once. A
        tower's names may carry transformers' older `vision_model.` level or lack it."""
        params = dict(self.named_parameters())
        buffers = dict(self.named_buffers())
        seen: set[str] = set()
        for name, tensor in weights:
            key = name if name in params or name in buffers else _other_level(name)
            if key not in params and key not in buffers:
                raise KeyError(f"vision tensor {name!r} has no parameter here")
            target = params.get(key, buffers.get(key))
            assert target is not None
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != {tuple(target.shape)}")
            target.copy_(tensor)
            seen.add(key)
        missing = sorted(set(params) - seen)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} vision tensors, e.g. "
                             f"{missing[:4]}")


def _other_level(name: str) -> str:
    """`tower.vision_model.x` <-> `tower.x` (transformers' two spellings of a vision tower)."""
    head, _, rest = name.partition(".")
    if rest.startswith("vision_model."):
        return f"{head}.{rest.removeprefix('vision_model.')}"
    return f"{head}.vision_model.{rest}"
