"""Qwen2-VL and Qwen2.5-VL (Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration):
a ViT over the image's patches at its own resolution (the processor resizes it to a multiple of
patch x merge and flattens each temporal_patch x patch x patch block; Qwen2.5-VL's tower adds
window attention and RMSNorm), with 2-D rotary positions inside the tower, and a merger that
folds each merge x merge block of patches into one row projected to the decoder's width. One
image: patches [h x w, C x T x P x P] and its grid [1, 3] = (t, h, w) -> [t x h x w / merge^2,
hidden], row-major over the merged grid.

The decoder reads those rows at 3-D positions (temporal, height, width: `position_grid`
gives the merged grid), multimodal RoPE (worker/image_positions.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from radixrt.runtime.models.vision.encoder import VisionEncoder, transformers_config


class Qwen2VLEncoder(VisionEncoder):
    weight_prefixes = (("model.visual.", "tower."), ("visual.", "tower."))

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        vision = transformers_config(cfg["vision_config"])
        if cfg["model_type"] == "qwen2_5_vl":
            from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
                Qwen2_5_VisionTransformerPretrainedModel as Tower,
            )
        else:
            from transformers.models.qwen2_vl.modeling_qwen2_vl import (
                Qwen2VisionTransformerPretrainedModel as Tower,
            )
        self.tower = Tower(vision)
        self.merge = int(vision.spatial_merge_size)

    def encode(self, tensors: Mapping[str, Tensor]) -> Tensor:
        grid = tensors["image_grid_thw"]  # [1, 3]
        return self.tower(tensors["pixel_values"], grid_thw=grid).pooler_output

    def position_grid(self, tensors: Mapping[str, Tensor]) -> tuple[int, int, int]:
        """The image's merged grid (t, h, w): its rows' 3-D positions."""
        t, h, w = (int(x) for x in tensors["image_grid_thw"][0])
        return t, h // self.merge, w // self.merge
