"""LLaVA-NeXT (LlavaNextForConditionalGeneration): LLaVA's tower and projector over an "any
resolution" tiling. The processor picks the grid of `image_grid_pinpoints` that fits the
image best, cuts the resized image into tiles of the tower's size, and puts a downscaled view
of the whole image first. Here the view's patches come first; then the tiles' patches laid out
as one large grid, cropped back to the image's aspect ratio (the processor padded it), each row
of patches followed by the learned `image_newline` row. One image: [1, tiles + 1, 3, S, S] and
its size [1, 2] -> [patches + rows x (columns + 1), hidden]."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from radixrt.runtime.models.vision.llava import LlavaEncoder


class LlavaNextEncoder(LlavaEncoder):
    weight_prefixes = (*LlavaEncoder.weight_prefixes, ("model.image_newline", "image_newline"),
                       ("image_newline", "image_newline"))

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__(cfg)
        self.pinpoints = [list(p) for p in cfg["image_grid_pinpoints"]]
        self.tile = int(cfg["vision_config"]["image_size"])
        self.side = self.tile // int(cfg["vision_config"]["patch_size"])  # patches a tile side
        self.image_newline = nn.Parameter(torch.empty(int(cfg["text_config"]["hidden_size"])))

    def encode(self, tensors: Mapping[str, Tensor]) -> Tensor:
        from transformers.models.llava_next.modeling_llava_next import (
            get_anyres_image_grid_shape,
            image_size_to_num_patches,
            unpad_image,
        )

        size = [int(x) for x in tensors["image_sizes"][0]]  # (height, width)
        count = image_size_to_num_patches(size, self.pinpoints, self.tile)
        features = self.patch_features(tensors["pixel_values"][0][:count])  # [count, p, hidden]
        newline = self.image_newline.to(features.dtype)
        if count == 1:
            return torch.cat((features[0], newline[None]))
        rows, cols = get_anyres_image_grid_shape(size, self.pinpoints, self.tile)
        dim = features.shape[-1]
        grid = features[1:].reshape(rows, cols, self.side, self.side, dim)
        grid = grid.permute(4, 0, 2, 1, 3).reshape(dim, rows * self.side, cols * self.side)
        grid = unpad_image(grid, size)  # [hidden, H, W]: the padding cropped off
        grid = torch.cat((grid, newline[:, None, None].expand(dim, grid.shape[1], 1)), dim=2)
        return torch.cat((features[0], grid.flatten(1).t()))  # [rows, hidden]
