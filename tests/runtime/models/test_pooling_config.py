"""What a checkpoint says about pooling (no model): sentence-transformers' files in both of their
spellings, the modules that would change the vector refused by name, the tasks `--task` and
the checkpoint give, and a classifier architecture read as its language model with labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from toy_tokenizers import byte_level_bpe

from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.pooling_config import read_pooling_info
from radixrt.runtime.models.registry import model_config

LM = ModelConfig(architecture="LlamaForCausalLM", vocab_size=100, hidden_size=32,
                 intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
CLASSIFIER = ModelConfig(**{**LM.__dict__, "num_labels": 3, "labels": ("x", "y", "z")})
REWARD = ModelConfig(**{**LM.__dict__, "num_labels": 1, "labels": ("LABEL_0",)})
TRANSFORMER = {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"}


def st_folder(tmp_path: Path, pooling: dict, *extra: dict) -> Path:
    modules = [TRANSFORMER, {"idx": 1, "path": "1_Pooling",
                             "type": "sentence_transformers.models.Pooling"}, *extra]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


@pytest.mark.parametrize("pooling, mode", [
    ({"pooling_mode": "lasttoken"}, "last"),
    ({"pooling_mode": "mean"}, "mean"),
    ({"pooling_mode": ["cls"]}, "cls"),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, "mean"),
    ({"pooling_mode_lasttoken": True}, "last"),
])
def test_sentence_transformers_pooling_is_read(tmp_path: Path, pooling: dict, mode: str) -> None:
    folder = st_folder(tmp_path, pooling)
    info = read_pooling_info(str(folder), LM, "auto", None, True)
    assert (info.mode, info.normalize, info.task) == (mode, False, "embed")
    assert info.hidden_size == 32 and info.generates


def test_a_normalize_module_makes_unit_vectors(tmp_path: Path) -> None:
    folder = st_folder(tmp_path, {"pooling_mode": "mean"},
                       {"idx": 2, "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    assert read_pooling_info(str(folder), LM, "auto", None, True).normalize


@pytest.mark.parametrize("pooling, extra, message", [
    ({"pooling_mode": "max"}, [], r"pooling \['max'\] is not supported"),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}, [],
     "is not supported"),
    ({"pooling_mode": "weightedmean"}, [], "is not supported"),
    ({"pooling_mode": "lasttoken"},
     [{"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}],
     "module 'Dense' .*2_Dense.* is not supported"),
])
def test_what_would_change_the_vector_is_refused(tmp_path: Path, pooling: dict, extra: list,
                                                 message: str) -> None:
    folder = st_folder(tmp_path, pooling, *extra)
    with pytest.raises(ValueError, match=message):
        read_pooling_info(str(folder), LM, "auto", None, True)


def test_tasks_from_the_checkpoint_and_the_flag() -> None:
    plain = read_pooling_info(None, LM, "auto", None, True)
    assert (plain.task, plain.mode, plain.normalize) == ("generate", "last", True)
    assert read_pooling_info(None, CLASSIFIER, "auto", None, False).task == "classify"
    reward = read_pooling_info(None, REWARD, "auto", None, False)
    assert (reward.task, reward.num_labels, reward.labels) == ("reward", 1, ("LABEL_0",))
    assert read_pooling_info(None, REWARD, "rerank", None, False).rerank_tokens == ()
    with pytest.raises(ValueError, match="task='classify' needs a classification head"):
        read_pooling_info(None, LM, "classify", None, True)
    with pytest.raises(ValueError, match="no LM head"):
        read_pooling_info(None, CLASSIFIER, "generate", None, False)
    with pytest.raises(ValueError, match="needs one label .* this one has 3"):
        read_pooling_info(None, CLASSIFIER, "rerank", None, False)
    with pytest.raises(ValueError, match="task='nope' is invalid"):
        read_pooling_info(None, LM, "nope", None, True)


def test_an_lm_reranker_reads_its_yes_and_no_tokens() -> None:
    tok = byte_level_bpe(["yes no yes no maybe"] * 20, 300)
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    info = read_pooling_info(None, LM, "rerank", tok, True)
    assert info.rerank_tokens == (tok.convert_tokens_to_ids("no"),
                                  tok.convert_tokens_to_ids("yes"))
    small = byte_level_bpe(["abc"], 260)  # "yes" is three bytes there
    small.chat_template = tok.chat_template
    with pytest.raises(ValueError, match="splits 'no' into 2 tokens"):
        read_pooling_info(None, LM, "rerank", small, True)
    with pytest.raises(ValueError, match="has no tokenizer"):
        read_pooling_info(None, LM, "rerank", None, True)
    tok.chat_template = "{{ raise_exception('no chat here') }}"  # refused at start, by name
    with pytest.raises(ValueError, match="chat template, which failed: no chat here"):
        read_pooling_info(None, LM, "rerank", tok, True)


def test_a_gguf_files_pooling_type() -> None:
    """llama.cpp's `{arch}.pooling_type`: 1 mean, 2 CLS, 3 last; others leave the last token."""
    modes = {k: read_pooling_info(None, LM, "auto", None, True, k).mode for k in (0, 1, 2, 3, 4)}
    assert modes == {0: "last", 1: "mean", 2: "cls", 3: "last", 4: "last"}


def test_a_classifier_architecture_is_its_language_model_with_a_head() -> None:
    cfg = {"architectures": ["Qwen2ForSequenceClassification"], "model_type": "qwen2",
           "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "id2label": {"0": "neg", "1": "pos"}}
    config = model_config(cfg)
    assert config.architecture == "Qwen2ForCausalLM" and config.attention_bias  # Qwen2's
    assert (config.num_labels, config.labels) == (2, ("neg", "pos"))
    one = model_config({**cfg, "num_labels": 1, "id2label": {}})
    assert (one.num_labels, one.labels) == (1, ("LABEL_0",))
    with pytest.raises(ValueError, match="architecture 'FooForSequenceClassification' is not"):
        model_config({**cfg, "architectures": ["FooForSequenceClassification"]})
