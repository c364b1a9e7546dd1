"""The vision-language architectures: which decoder (of models/registry.py) reads their
text_config, where the decoder's tensors sit in their checkpoints, and which VisionEncoder
(models/vision/) turns their images into the decoder's input rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.models.tensor_source import Weight
from radixrt.runtime.models.vision.encoder import VisionEncoder
from radixrt.runtime.models.vision.idefics3 import Idefics3Encoder
from radixrt.runtime.models.vision.llava import LlavaEncoder


@dataclass(frozen=True)
class VisionFamily:
    """architectures: config.json's names; text_prefixes: checkpoint prefix -> the decoder's
    name prefix (both spellings transformers writes); encoder: builds the tower + projector
    from the whole config (as transformers reads it)."""

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    text_prefixes: tuple[tuple[str, str], ...]
    encoder: Callable[[Mapping[str, Any]], VisionEncoder]
    features: Mapping[str, str] = field(default_factory=dict)


LLAVA = VisionFamily(
    name="llava",
    architectures=("LlavaForConditionalGeneration",),
    model_types=("llava",),
    text_prefixes=(("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                   ("model.language_model.", "model."), ("lm_head.", "lm_head.")),
    encoder=LlavaEncoder,
    features={"images": "LLaVA-1.5: CLIP / SigLIP tower, MLP projector"},
)

IDEFICS3 = VisionFamily(
    name="idefics3",
    architectures=("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"),
    model_types=("idefics3", "smolvlm"),
    text_prefixes=(("model.text_model.", "model."), ("lm_head.", "lm_head.")),
    encoder=Idefics3Encoder,
    features={"images": "Idefics3 / SmolVLM: tiles + a global view, pixel-shuffle connector"},
)

VISION_FAMILIES: tuple[VisionFamily, ...] = (LLAVA, IDEFICS3)


def vision_family_of(cfg: Mapping[str, Any]) -> VisionFamily | None:
    """The vision family of a config.json (None: a text model)."""
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type")
    for family in VISION_FAMILIES:
        if (archs and archs[0] in family.architectures) or (
                not archs and model_type in family.model_types):
            return family
    return None


def text_config_of(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The decoder's config.json of a vision-language one (its text_config, named by its
    model_type; the eos / bos ids of the whole where the text part lacks them)."""
    text = dict(cfg["text_config"])
    text.pop("architectures", None)
    for key in ("eos_token_id", "bos_token_id", "tie_word_embeddings"):
        if text.get(key) is None and cfg.get(key) is not None:
            text[key] = cfg[key]
    return text


def split_weights(family: VisionFamily, encoder: VisionEncoder,
                  weights: Iterable[tuple[str, Weight]], vision: dict[str, Weight]
                  ) -> Iterator[tuple[str, Weight]]:
    """The decoder's tensors (renamed to a text model's names), in order; the encoder's go
    into `vision` under its own names. A tensor of neither raises."""
    for name, weight in weights:
        ours = encoder.target(name)
        if ours is not None:
            vision[ours] = weight
            continue
        for prefix, text in family.text_prefixes:
            if name.startswith(prefix):
                yield text + name.removeprefix(prefix), weight
                break
        else:
            raise KeyError(f"checkpoint tensor {name!r} is neither the decoder's nor the vision "
                           f"tower's of a {family.name} model")
