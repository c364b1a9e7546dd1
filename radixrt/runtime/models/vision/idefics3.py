"""Idefics3 and SmolVLM (Idefics3ForConditionalGeneration, SmolVLMForConditionalGeneration): a
SigLIP-style tower over each tile of the image (its processor splits a large image into rows x
columns of tiles plus a downscaled global view; tiles the processor padded with zeros are
dropped, padded pixels masked per patch), then the connector: a pixel shuffle that folds each
scale x scale block of patches into one row, and one linear projection. One image:
[1, tiles, 3, S, S] -> [tiles x patches / scale^2, hidden], tile by tile, as its placeholder
runs stand in the prompt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from radixrt.runtime.models.vision.encoder import VisionEncoder, transformers_config


def pixel_shuffle(x: Tensor, scale: int) -> Tensor:
    """[n, side * side, dim] patches -> [n, side^2 / scale^2, dim * scale^2]: each row of the
    result holds a scale x scale block (columns folded first, then rows)."""
    n, seq, dim = x.shape
    side = int(seq**0.5)
    x = x.reshape(n, side, side // scale, dim * scale)  # fold columns
    x = x.permute(0, 2, 1, 3).reshape(n, side // scale, side // scale, dim * scale * scale)
    return x.permute(0, 2, 1, 3).reshape(n, seq // (scale * scale), dim * scale * scale)


class Idefics3Encoder(VisionEncoder):
    weight_prefixes = (("model.vision_model.", "tower."), ("model.connector.", "connector."))

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionTransformer

        vision = transformers_config({**cfg["vision_config"], "model_type": "idefics3_vision"})
        self.tower = Idefics3VisionTransformer(vision)
        self.patch = int(vision.patch_size)
        self.scale = int(cfg.get("scale_factor", 2))
        self.connector = nn.Module()
        self.connector.modality_projection = nn.Module()
        self.connector.modality_projection.proj = nn.Linear(
            vision.hidden_size * self.scale**2, int(cfg["text_config"]["hidden_size"]),
            bias=False)

    def encode(self, tensors: Mapping[str, Tensor]) -> Tensor:
        pixels = tensors["pixel_values"][0]  # [tiles, 3, S, S]
        mask = tensors.get("pixel_attention_mask")
        real = (pixels != 0).flatten(1).any(dim=1)  # tiles the processor did not pad
        pixels = pixels[real]
        if mask is None:
            patches = None
        else:
            pixel_mask = mask[0][real]  # [tiles, S, S]
            blocks = pixel_mask.unfold(1, self.patch, self.patch).unfold(2, self.patch,
                                                                          self.patch)
            patches = blocks.sum(dim=(-1, -2)) > 0  # [tiles, S / p, S / p]
        hidden = self.tower(pixel_values=pixels, patch_attention_mask=patches).last_hidden_state
        features = self.connector.modality_projection.proj(pixel_shuffle(hidden, self.scale))
        return features.reshape(-1, features.shape[-1])  # [tiles * rows, hidden]
