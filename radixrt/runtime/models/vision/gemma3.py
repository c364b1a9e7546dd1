"""Gemma 3 (Gemma3ForConditionalGeneration): a SigLIP tower over the image at its fixed size
(896 px: 64 x 64 patches), its last hidden states average-pooled to mm_tokens_per_image rows
(16 x 16), normed (RMSNorm by 1 + w) and projected to the decoder's width. One image:
[1, 3, S, S] -> [mm_tokens_per_image, hidden], between the processor's <start_of_image> and
<end_of_image>.

An image's rows attend to each other in both directions (`bidirectional`: transformers' block
mask OR'd with the causal one, within each layer's sliding window), so the decoder computes an
image's run in one piece (scheduler/image_blocks.py) with each row seeing up to the run's
last position (ForwardBatch.key_limits)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from radixrt.runtime.models.vision.encoder import VisionEncoder, transformers_config


class Gemma3Projector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, eps: float, side: int,
                 tokens: int) -> None:
        super().__init__()
        self.mm_input_projection_weight = nn.Parameter(torch.empty(vision_hidden, text_hidden))
        self.mm_soft_emb_norm = nn.Module()
        self.mm_soft_emb_norm.weight = nn.Parameter(torch.empty(vision_hidden))
        self.eps = eps
        self.side = side  # patches per image side
        self.kernel = side // int(tokens**0.5)

    def forward(self, hidden: Tensor) -> Tensor:
        # hidden: [n, side * side, vision_hidden] -> [n, tokens, text_hidden]
        n, _, dim = hidden.shape
        grid = hidden.transpose(1, 2).reshape(n, dim, self.side, self.side)
        pooled = nn.functional.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        x = pooled.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        normed = (x * (1.0 + self.mm_soft_emb_norm.weight.float())).to(pooled.dtype)
        return normed @ self.mm_input_projection_weight


class Gemma3Encoder(VisionEncoder):
    weight_prefixes = (("model.vision_tower.", "tower."), ("vision_tower.", "tower."),
                       ("model.multi_modal_projector.", "projector."),
                       ("multi_modal_projector.", "projector."))
    bidirectional = True

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        from transformers import AutoModel

        vision = transformers_config(cfg["vision_config"])
        self.tower = AutoModel.from_config(vision)
        self.projector = Gemma3Projector(
            vision.hidden_size, int(cfg["text_config"]["hidden_size"]),
            float(vision.layer_norm_eps), int(vision.image_size // vision.patch_size),
            int(cfg.get("mm_tokens_per_image", 256)))

    def encode(self, tensors: Mapping[str, Tensor]) -> Tensor:
        # [views, 3, S, S]: the image (and its pan-and-scan crops, each a run of its own)
        hidden = self.tower(pixel_values=tensors["pixel_values"]).last_hidden_state
        features = self.projector(hidden)  # [views, tokens, hidden]
        return features.reshape(-1, features.shape[-1])  # [views x tokens, hidden]
