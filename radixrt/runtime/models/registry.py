"""The model registry: an HF `architectures` name (or `model_type`), or a GGUF
`general.architecture`, to its family (models/families/). Adding an architecture is one family
file, a line here and a test (tests/runtime/models/test_decoder_families.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from radixrt.runtime.models.families.deepseek import DEEPSEEK
from radixrt.runtime.models.families.family import ModelFamily
from radixrt.runtime.models.families.gemma import GEMMA
from radixrt.runtime.models.families.glm4_moe import GLM4_MOE
from radixrt.runtime.models.families.gpt_oss import GPT_OSS
from radixrt.runtime.models.families.granite import GRANITE
from radixrt.runtime.models.families.llama import LLAMA
from radixrt.runtime.models.families.mixtral import MIXTRAL
from radixrt.runtime.models.families.olmo2 import OLMO2
from radixrt.runtime.models.families.olmoe import OLMOE
from radixrt.runtime.models.families.phi3 import PHI3
from radixrt.runtime.models.families.qwen_moe import QWEN_MOE
from radixrt.runtime.models.families.smollm3 import SMOLLM3
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.tensor_source import Weight

# `XForSequenceClassification` is family X's decoder with a classification head (score.weight)
# in place of the LM head: read as `XForCausalLM`, its head from num_labels / id2label
CLASSIFIER_SUFFIX = "ForSequenceClassification"
MAX_LABELS = 1 << 16

FAMILIES: tuple[ModelFamily, ...] = (LLAMA, GEMMA, PHI3, OLMO2, GRANITE, SMOLLM3, MIXTRAL,
                                      QWEN_MOE, OLMOE, GPT_OSS, DEEPSEEK, GLM4_MOE)


def supported_architectures() -> tuple[str, ...]:
    return tuple(arch for family in FAMILIES for arch in family.architectures)


def family_of(architecture: str) -> ModelFamily:
    """The family of an HF architecture name; refused with the list of those supported."""
    base = causal_lm_of(architecture)
    for family in FAMILIES:
        if base in family.architectures:
            return family
    also = (f" (and their *{CLASSIFIER_SUFFIX} classifiers)"
            if architecture.endswith(CLASSIFIER_SUFFIX) else "")
    raise ValueError(f"architecture {architecture!r} is not supported; supported: "
                     f"{', '.join(supported_architectures())}{also}")


def architecture_of(cfg: Mapping[str, Any]) -> str:
    """config.json's first "architectures" entry, else the one its "model_type" names."""
    archs = cfg.get("architectures") or []
    if archs:
        return str(archs[0])
    model_type = str(cfg.get("model_type", ""))
    for family in FAMILIES:
        if model_type in family.model_types:
            return family.architectures[family.model_types.index(model_type)]
    raise ValueError(f"config.json names no architecture and its model_type {model_type!r} is "
                     f"not supported; supported: {', '.join(supported_architectures())}")


def causal_lm_of(architecture: str) -> str:
    """The language model a classifier architecture is built on (others unchanged)."""
    if architecture.endswith(CLASSIFIER_SUFFIX):
        return architecture.removesuffix(CLASSIFIER_SUFFIX) + "ForCausalLM"
    return architecture


def model_config(cfg: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig of a parsed config.json, read by its family (a classifier as its language
    model, with the head's labels)."""
    architecture = architecture_of(cfg)
    base = causal_lm_of(architecture)
    config = family_of(architecture).read_config(cfg, base)
    if base == architecture:
        return config
    id2label = cfg.get("id2label") or {}
    num_labels = int(cfg.get("num_labels") or len(id2label) or 2)
    if not 1 <= num_labels <= MAX_LABELS:
        raise ValueError(f"num_labels={num_labels}: a classification head has 1 to "
                         f"{MAX_LABELS} labels")
    labels = tuple(str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}")))
                   for i in range(num_labels))
    return replace(config, num_labels=num_labels, labels=labels)


def checkpoint_weights(weights: Iterator[tuple[str, Weight]],
                       config: ModelConfig) -> Iterator[tuple[str, Weight]]:
    """A checkpoint's tensors under the decoder's names (the family's renames applied)."""
    rename = family_of(config.architecture).rename
    for name, weight in weights:
        yield from rename(name, weight, config)
