"""Tiny random-weight pooling checkpoints built with transformers' own classes (nothing is
downloaded), with the default model's tokenizer beside them and, for the embedders,
sentence-transformers' files: three embedders (Qwen2 last-token normalized, Llama mean, Qwen3
CLS normalized), two
classifiers (Qwen2 of three labels, a Llama of one label: a reward model / cross-encoder whose
tokenizer has no chat template, as sentence-transformers then tokenizes text pairs), a Qwen3
reward model and a Qwen3 language model that reranks by its yes/no tokens."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from tiny_models import TINY, randomize_weights

ST_MODULES = [{"idx": 0, "name": "0", "path": "",
               "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling",
               "type": "sentence_transformers.models.Pooling"}]
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"}
# name -> (transformers config class, model class, seed, config extras)
POOLING_MODELS: dict[str, tuple[str, str, int, dict[str, Any]]] = {
    "qwen2-embed": ("Qwen2Config", "Qwen2ForCausalLM", 1, {}),
    "llama-mean": ("LlamaConfig", "LlamaForCausalLM", 2, {}),
    "qwen3-cls": ("Qwen3Config", "Qwen3ForCausalLM", 7, dict(head_dim=16)),
    "qwen2-classify": ("Qwen2Config", "Qwen2ForSequenceClassification", 3,
                       dict(num_labels=3, id2label={0: "neg", 1: "neutral", 2: "pos"})),
    "llama-reward": ("LlamaConfig", "LlamaForSequenceClassification", 4, dict(num_labels=1)),
    "qwen3-reward": ("Qwen3Config", "Qwen3ForSequenceClassification", 6,
                     dict(num_labels=1, head_dim=16)),
    "qwen3-rerank": ("Qwen3Config", "Qwen3ForCausalLM", 5, dict(head_dim=16)),
}
NO_CHAT_TEMPLATE = ("llama-reward",)
SENTENCE_TRANSFORMERS = {"qwen2-embed": ("lasttoken", True), "llama-mean": ("mean", False),
                         "qwen3-cls": ("cls", True)}


def build_pooling_model(name: str, folder: Path, tokenizer: Any) -> Any:
    """Save the tiny `name` checkpoint in folder; return transformers' model of it."""
    import transformers as tf

    kind, model_cls, seed, extra = POOLING_MODELS[name]
    config = getattr(tf, kind)(**TINY, vocab_size=len(tokenizer),
                               bos_token_id=tokenizer.bos_token_id,
                               eos_token_id=tokenizer.eos_token_id,
                               pad_token_id=tokenizer.eos_token_id, **extra)
    torch.manual_seed(seed)
    model = getattr(tf, model_cls)(config).eval()
    randomize_weights(model)
    model.save_pretrained(folder)
    if name in NO_CHAT_TEMPLATE:
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = None
    tokenizer.save_pretrained(folder)
    if name in SENTENCE_TRANSFORMERS:
        write_sentence_transformers(folder, *SENTENCE_TRANSFORMERS[name])
    return model


def build_pooling_models(root: Path, tokenizer: Any,
                         names: tuple[str, ...] = tuple(POOLING_MODELS)) -> dict[str, Path]:
    for name in names:
        build_pooling_model(name, root / name, tokenizer)
    return {name: root / name for name in names}


def write_sentence_transformers(folder: Path, mode: str, normalize: bool) -> None:
    modules = ST_MODULES + ([NORMALIZE] if normalize else [])
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"embedding_dimension": TINY["hidden_size"], "pooling_mode": mode}))
    if normalize:
        (folder / "2_Normalize").mkdir()
