"""PEFT adapter folders read without torch (models/lora_format.py) and the scheduler's table of
adapters (scheduler/lora_table.py), on a tiny Llama's adapters made by PEFT: ranks and scales
as PEFT computes them, digests and namespaces, every adapter a server cannot serve refused with a
message naming it, and what the worker is told (a load before first use, an unload once no
request uses the adapter). No model is loaded."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from lora_adapters import make_adapter
from safetensors.torch import load_file, save_file

from radixrt.runtime.models.lora_format import lora_namespace, module_shapes, read_spec
from radixrt.runtime.scheduler.lora_table import LoraTable

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
SHAPES = module_shapes(hidden=64, q_rows=64, kv_rows=32, intermediate=128,
                       dense_mlp_layers=[0, 1], num_layers=2)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import transformers

    root = tmp_path_factory.mktemp("lora_format")
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()
    peft_models = {kind: make_adapter(copy.deepcopy(base), root / kind, kind, seed=i)
                   for i, kind in enumerate(("attn-r4", "all-r8-rslora", "mlp-patterns"))}
    return {"root": root, "peft": peft_models}


def peft_scales(model: Any) -> dict[tuple[int, str], tuple[int, float]]:
    """(layer, PEFT module name) -> (rank, scale) as PEFT holds them."""
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "scaling") and "default" in getattr(module, "r", {}):
            layer = int(name.split(".layers.")[1].split(".")[0])
            out[(layer, name.rsplit(".", 1)[1])] = (module.r["default"],
                                                    module.scaling["default"])
    return out


@pytest.mark.parametrize("kind", ["attn-r4", "all-r8-rslora", "mlp-patterns"])
def test_ranks_and_scales_are_pefts(adapters: dict[str, Any], kind: str) -> None:
    spec = read_spec(str(adapters["root"] / kind), SHAPES, max_rank=16)
    parts = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
             "o_proj": ("o_proj", None), "gate_proj": ("gate_up_proj", 0),
             "up_proj": ("gate_up_proj", 1), "down_proj": ("down_proj", None)}
    got = {(p.layer, p.module, p.part): (p.rank, p.scale) for p in spec.pairs}
    want = {(layer, *parts[name]): value
            for (layer, name), value in peft_scales(adapters["peft"][kind]).items()}
    assert got.keys() == want.keys() and got
    for where, (rank, scale) in got.items():
        assert rank == want[where][0] and scale == pytest.approx(want[where][1]), where
    assert spec.rank == max(r for r, _ in got.values())
    again = read_spec(str(adapters["root"] / kind), SHAPES, max_rank=16)
    assert again.digest == spec.digest and len(spec.digest) == 64


def test_namespaces_keep_adapters_and_salts_apart(adapters: dict[str, Any]) -> None:
    a = read_spec(str(adapters["root"] / "attn-r4"), SHAPES, 16).digest
    b = read_spec(str(adapters["root"] / "all-r8-rslora"), SHAPES, 16).digest
    spaces = {lora_namespace(a, None), lora_namespace(a, "s"), lora_namespace(b, None),
              lora_namespace(b, "s"), None, "s"}
    assert len(spaces) == 6


def changed_copy(src: Path, dst: Path, config: dict[str, Any] | None = None,
                 tensors: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> str:
    dst.mkdir()
    cfg = json.loads((src / "adapter_config.json").read_text())
    (dst / "adapter_config.json").write_text(json.dumps({**cfg, **(config or {})}))
    weights = load_file(str(src / "adapter_model.safetensors"))
    save_file(tensors(weights) if tensors else weights, str(dst / "adapter_model.safetensors"))
    return str(dst)


@pytest.mark.parametrize(("change", "message"), [
    (dict(config={"use_dora": True}), "DoRA"),
    (dict(config={"modules_to_save": ["lm_head"]}), "modules_to_save"),
    (dict(config={"bias": "all"}), "bias"),
    (dict(config={"fan_in_fan_out": True}), "fan_in_fan_out"),
    (dict(config={"peft_type": "IA3"}), "only LoRA"),
    (dict(config={"lora_alpha": -1}), "lora_alpha=-1"),
    (dict(config={"lora_alpha": float("inf")}), "positive finite"),
    (dict(config={"alpha_pattern": {"(\\w|\\w)*!": 2}}), "regular expressions"),
    (dict(config={"rank_pattern": {"q_proj": None}}), "positive finite"),
    (dict(tensors=lambda w: {k: torch.full_like(v, float("nan")) if i == 0 else v
                             for i, (k, v) in enumerate(w.items())}), "NaN or an infinity"),
    (dict(tensors=lambda w: {**w, "base_model.model.model.embed_tokens.lora_embedding_A":
                             next(iter(w.values())).clone()}), "embedding"),
    (dict(tensors=lambda w: {**w, "base_model.model.lm_head.lora_A.weight":
                             next(iter(w.values())).clone()}), "not a LoRA pair"),
    (dict(tensors=lambda w: {k: v for k, v in w.items() if "lora_B" not in k}), "without"),
    (dict(tensors=lambda w: {k: v[:, :-1].contiguous() if "lora_A" in k else v
                             for k, v in w.items()}), "do not fit"),
    (dict(tensors=lambda w: {k.replace("layers.0.", "layers.7."): v for k, v in w.items()}),
     "no such layer"),
])
def test_unservable_adapters_are_refused(adapters: dict[str, Any], tmp_path: Path,
                                         change: dict[str, Any], message: str) -> None:
    path = changed_copy(adapters["root"] / "attn-r4", tmp_path / "bad", **change)
    with pytest.raises(ValueError, match=message):
        read_spec(path, SHAPES, max_rank=16)


def test_a_rank_past_the_limit_and_a_missing_folder(adapters: dict[str, Any],
                                                    tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rank 8, above the server's --max-lora-rank 4"):
        read_spec(str(adapters["root"] / "all-r8-rslora"), SHAPES, max_rank=4)
    with pytest.raises(ValueError, match="not a PEFT LoRA adapter folder"):
        read_spec(str(tmp_path), SHAPES, max_rank=16)


def test_the_table_tells_the_worker_what_it_needs(adapters: dict[str, Any]) -> None:
    """A load before first use, once per set of files (two names, one key); an unload only when
    no request uses the key and no other name serves it; at most max_per_batch adapters a step."""
    table = LoraTable(SHAPES, max_rank=16, max_per_batch=2, max_adapters=3)
    a, b = (str(adapters["root"] / k) for k in ("attn-r4", "all-r8-rslora"))
    key = table.load("a", a).key
    assert table.load("a2", a).key == key
    assert [x.key for x in table.take_loads()] == [key] and table.take_loads() == []
    key_b = table.load("b", b).key
    assert table.resolve("a", "salt") == (key, lora_namespace(table.by_name["a"].spec.digest,
                                                               "salt"))
    with pytest.raises(ValueError, match="loaded already"):
        table.load("b", a)
    with pytest.raises(ValueError, match="the most one server holds"):
        table.load("c", a)
    table.unload("a")
    assert table.take_unloads([]) == []  # "a2" still serves the files
    table.unload("a2")
    assert table.take_unloads([key]) == []  # a request still runs under it
    assert table.take_unloads([None]) == [key]
    with pytest.raises(KeyError):
        table.unload("a")
    assert table.fits([key_b, None], key_b) and table.fits([None, None], key)
    assert table.fits([key_b], key) and not table.fits([key_b, "other"], key)
    with pytest.raises(ValueError, match="serves no LoRA adapters"):
        LoraTable(None, 16, 2, 3).load("a", a)


@pytest.mark.parametrize("header", [
    {"x.lora_A.weight": {"dtype": "F32", "shape": None, "data_offsets": [0, 0]}},
    {"x.lora_A.weight": {"dtype": "F32", "shape": [2, 64], "data_offsets": [0, 10**9]}},
    ["not", "an", "object"],
])
def test_a_malformed_weights_file_is_refused(adapters: dict[str, Any], tmp_path: Path,
                                             header: Any) -> None:
    """A header of the wrong shape is a ValueError naming the file (never another exception
    out of the scheduler)."""
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(
        (adapters["root"] / "attn-r4" / "adapter_config.json").read_text())
    raw = json.dumps(header).encode()
    (folder / "adapter_model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    with pytest.raises(ValueError, match="adapter_model.safetensors"):
        read_spec(str(folder), SHAPES, max_rank=16)
