"""Random LoRA adapters in PEFT's own format, made by PEFT on a tiny checkpoint (tests/
tiny_models.py) or on any transformers model, and the PEFT model beside them as the reference.

ADAPTERS are the kinds the tests use: attention only at rank 4 (lora_alpha 8), every projection
at rank 8 under rsLoRA, and the MLP with a rank_pattern / alpha_pattern (per-module ranks and
scales). `init_lora_weights=False` draws B as well as A (PEFT's default starts B at zero, an
adapter that changes nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
FUSED = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]  # Phi-3's own projections
ADAPTERS: dict[str, dict[str, Any]] = {
    "attn-r4": dict(r=4, lora_alpha=8, targets="attention"),
    "all-r8-rslora": dict(r=8, lora_alpha=16, use_rslora=True, targets="all"),
    "mlp-patterns": dict(r=2, lora_alpha=4, targets="mlp",
                         rank_pattern={"down_proj": 6}, alpha_pattern={"up_proj": 12}),
}


def targets_of(kind: str, fused: bool) -> list[str]:
    if fused:
        return {"attention": FUSED[:2], "mlp": FUSED[2:], "all": FUSED}[kind]
    return {"attention": ATTENTION, "mlp": MLP, "all": ATTENTION + MLP}[kind]


def make_adapter(base: Any, folder: Path | str, kind: str | dict[str, Any], seed: int,
                 std: float = 0.2) -> Any:
    """Wrap `base` (a transformers model, changed in place) in a random PEFT LoRA adapter of
    `kind` (a name of ADAPTERS, or such a dict), save it in `folder`, and return the PEFT model
    (eval mode)."""
    import peft

    spec = dict(ADAPTERS[kind] if isinstance(kind, str) else kind)
    fused = getattr(base.config, "model_type", "") == "phi3"
    targets = targets_of(spec.pop("targets"), fused)
    if fused:  # Phi-3's patterns name its fused modules
        spec["rank_pattern"] = {k.replace("up_proj", "gate_up_proj"): v
                                for k, v in spec.get("rank_pattern", {}).items()}
        spec["alpha_pattern"] = {k.replace("up_proj", "gate_up_proj"): v
                                 for k, v in spec.get("alpha_pattern", {}).items()}
    config = peft.LoraConfig(target_modules=targets, init_lora_weights=False, **spec)
    model = peft.get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    model.save_pretrained(folder)
    return model.eval()
