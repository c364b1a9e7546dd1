"""The vision-language architectures: which decoder (of models/registry.py) reads their
text_config, where the decoder's tensors sit in their checkpoints, and which VisionEncoder
(models/vision/) turns their images into the decoder's input rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from radixrt.runtime.models.tensor_source import Weight
from radixrt.runtime.models.vision.encoder import VisionEncoder
from radixrt.runtime.models.vision.gemma3 import Gemma3Encoder
from radixrt.runtime.models.vision.idefics3 import Idefics3Encoder
from radixrt.runtime.models.vision.llava import LlavaEncoder
from radixrt.runtime.models.vision.llava_next import LlavaNextEncoder
from radixrt.runtime.models.vision.qwen2_vl import Qwen2VLEncoder


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
    # the decoder's architecture where text_config's model_type is the VLM's own
    text_architecture: str | None = None
    # the image token when the processor class cannot be built (tokenizer/image_processors.py)
    image_token: str | None = None


LLAVA = VisionFamily(
    name="llava",
    architectures=("LlavaForConditionalGeneration",),
    model_types=("llava",),
    text_prefixes=(("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                   ("model.language_model.", "model."), ("lm_head.", "lm_head.")),
    encoder=LlavaEncoder,
    features={"images": "LLaVA-1.5: CLIP / SigLIP tower, MLP projector"},
)

LLAVA_NEXT = VisionFamily(
    name="llava-next",
    architectures=("LlavaNextForConditionalGeneration",),
    model_types=("llava_next",),
    text_prefixes=LLAVA.text_prefixes,
    encoder=LlavaNextEncoder,
    features={"images": "LLaVA-NeXT: any-resolution tiles, unpadded, newline rows"},
)

IDEFICS3 = VisionFamily(
    name="idefics3",
    architectures=("Idefics3ForConditionalGeneration", "SmolVLMForConditionalGeneration"),
    model_types=("idefics3", "smolvlm"),
    text_prefixes=(("model.text_model.", "model."), ("lm_head.", "lm_head.")),
    encoder=Idefics3Encoder,
    features={"images": "Idefics3 / SmolVLM: tiles + a global view, pixel-shuffle connector"},
)

QWEN2_VL = VisionFamily(
    name="qwen2-vl",
    architectures=("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"),
    model_types=("qwen2_vl", "qwen2_5_vl"),
    text_prefixes=(("model.language_model.", "model."), ("model.", "model."),
                   ("lm_head.", "lm_head.")),
    encoder=Qwen2VLEncoder,
    features={"images": "Qwen2-VL / Qwen2.5-VL: any resolution, multimodal RoPE"},
    text_architecture="Qwen2ForCausalLM",
    image_token="<|image_pad|>",
)

GEMMA3 = VisionFamily(
    name="gemma3",
    architectures=("Gemma3ForConditionalGeneration",),
    model_types=("gemma3",),
    text_prefixes=(("model.language_model.", "model."), ("language_model.model.", "model."),
                   ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head.")),
    encoder=Gemma3Encoder,
    features={"images": "Gemma 3: SigLIP, pooled to 256 rows, seen both ways"},
)

VISION_FAMILIES: tuple[VisionFamily, ...] = (LLAVA, LLAVA_NEXT, IDEFICS3, QWEN2_VL, GEMMA3)


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
    model_type or the family's text_architecture; the bos id of the whole where the text part
    lacks it, the end-of-sequence ids of both; multimodal RoPE's sections as
    `mrope_section`)."""
    family = vision_family_of(cfg)
    assert family is not None
    text = dict(cfg["text_config"])
    text.pop("architectures", None)
    if family.text_architecture is not None:
        text["architectures"] = [family.text_architecture]
    for key in ("rope_parameters", "rope_scaling"):
        rope = dict(text.get(key) or {})
        if "mrope_section" in rope:
            text["mrope_section"] = [int(x) for x in rope.pop("mrope_section")]
            if rope.get("rope_type", rope.get("type")) == "mrope":
                rope["rope_type"] = "default"
                rope.pop("type", None)
            text[key] = rope
    for key in ("bos_token_id", "tie_word_embeddings"):
        if text.get(key) is None and cfg.get(key) is not None:
            text[key] = cfg[key]
    eos = [x for key in (text.get("eos_token_id"), cfg.get("eos_token_id")) if key is not None
           for x in (key if isinstance(key, list) else [key])]
    if eos:  # the whole's (Gemma 3's <end_of_turn>) beside the text part's own
        text["eos_token_id"] = list(dict.fromkeys(eos))
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
