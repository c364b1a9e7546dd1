"""LLaVA-1.5 (LlavaForConditionalGeneration): a CLIP / SigLIP tower, the hidden states of
`vision_feature_layer` (or several, concatenated), the CLS row dropped under the "default"
strategy, then a two-layer MLP projector. One image: [1, 3, H, W] -> [patches, hidden]."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from radixrt.runtime.models.vision.encoder import VisionEncoder, transformers_config

LLAVA_TOWERS = ("clip_vision_model", "siglip_vision_model")  # towers that need no image sizes


class MultiModalProjector(nn.Module):
    """linear_1 -> activation -> linear_2 (LLaVA's and LLaVA-NeXT's projector)."""

    def __init__(self, in_dim: int, out_dim: int, act: str, bias: bool) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.linear_1 = nn.Linear(in_dim, out_dim, bias=bias)
        self.act = ACT2FN[act]
        self.linear_2 = nn.Linear(out_dim, out_dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


def feature_layers(cfg: Mapping[str, Any]) -> list[int]:
    layer = cfg.get("vision_feature_layer", -2)
    return [int(x) for x in layer] if isinstance(layer, list) else [int(layer)]


class LlavaEncoder(VisionEncoder):
    weight_prefixes = (("model.vision_tower.", "tower."), ("vision_tower.", "tower."),
                       ("model.multi_modal_projector.", "projector."),
                       ("multi_modal_projector.", "projector."))

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        from transformers import AutoModel

        vision = transformers_config(cfg["vision_config"])
        if vision.model_type not in LLAVA_TOWERS:
            raise ValueError(f"a LLaVA vision tower of type {vision.model_type!r} is not "
                             f"supported; supported: {', '.join(LLAVA_TOWERS)}")
        self.tower = AutoModel.from_config(vision)
        self.layers = feature_layers(cfg)
        self.drop_cls = cfg.get("vision_feature_select_strategy", "default") == "default"
        self.projector = MultiModalProjector(
            vision.hidden_size * len(self.layers), int(cfg["text_config"]["hidden_size"]),
            str(cfg.get("projector_hidden_act", "gelu")),
            bool(cfg.get("multimodal_projector_bias", True)))

    def patch_features(self, pixel_values: Tensor) -> Tensor:
        """[n, 3, H, W] -> [n, patches, hidden]: the selected layers, projected."""
        out = self.tower(pixel_values, output_hidden_states=True)
        hidden = [out.hidden_states[i] for i in self.layers]
        if self.drop_cls:
            hidden = [h[:, 1:] for h in hidden]
        return self.projector(torch.cat(hidden, dim=-1))

    def encode(self, tensors: Mapping[str, Tensor]) -> Tensor:
        pixels = tensors["pixel_values"]  # [1, 3, H, W]
        return self.patch_features(pixels)[0]  # [patches, hidden]
