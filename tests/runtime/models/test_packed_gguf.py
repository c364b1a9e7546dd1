"""GGUF blocks packed without loss: for each block type with a packed form (Q4_0, Q4_1, Q8_0 from
gguf-py's quantizer; Q4_K, Q5_K, Q6_K from random blocks, which gguf-py can read but not write),
the packed weight dequantizes to gguf-py's floats bit for bit, and multiplying an identity through
the packed product gives them too. A type without a packed form is left to dequantization."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from radixrt.kernels.packed_gemm import packed_gemm
from radixrt.kernels.packed_reference import dequantize_ref
from radixrt.runtime.models.packed_gguf import PACKED_QTYPES, pack_gguf_rows

QT = gguf.GGMLQuantizationType
ROWS, COLS = 24, 512


def quantized(qtype: QT, seed: int = 0) -> np.ndarray:
    """[ROWS, row bytes] raw blocks of the type."""
    rng = np.random.default_rng(seed)
    if qtype in (QT.Q4_0, QT.Q4_1, QT.Q8_0):
        values = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        return gguf.quants.quantize(values, qtype).reshape(ROWS, -1)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(ROWS, COLS // block, size), dtype=np.uint8)

    def f16(low: float, high: float) -> np.ndarray:
        v = rng.uniform(low, high, size=(ROWS, COLS // block)).astype(np.float16)
        return v.view(np.uint8).reshape(ROWS, COLS // block, 2)

    if qtype == QT.Q6_K:
        raw[..., 208:210] = f16(1e-3, 2e-2)  # d comes last
    else:
        raw[..., 0:2], raw[..., 2:4] = f16(1e-3, 2e-2), f16(1e-3, 2e-2)  # d, dmin
    return raw.reshape(ROWS, -1)


@pytest.mark.parametrize("qtype", sorted(PACKED_QTYPES, key=int), ids=lambda q: QT(q).name)
def test_each_block_type_packs_without_loss(qtype: QT) -> None:
    raw = quantized(QT(qtype))
    want = torch.from_numpy(gguf.quants.dequantize(raw, QT(qtype)).astype(np.float32))
    packed = pack_gguf_rows(raw, qtype, COLS)
    assert packed is not None and packed.shape == (ROWS, COLS)
    assert torch.equal(dequantize_ref(packed), want.reshape(ROWS, COLS))
    eye = torch.eye(COLS)
    assert torch.equal(packed_gemm(eye[100:113], packed), want.reshape(ROWS, COLS).T[100:113])
    assert packed.nbytes < ROWS * COLS * 4 / 2  # far below float32


def test_a_type_without_a_packed_form_is_left_to_dequantization() -> None:
    raw = gguf.quants.quantize(np.ones((2, 64), dtype=np.float32), QT.Q5_0)
    assert pack_gguf_rows(raw.reshape(2, -1), QT.Q5_0, 64) is None


TEXT = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "english.txt"
# the packed model runs passes of 16 tokens (decode-sized: the packed kernels' products, the
# fused step), the reference passes of 512 (prefill-sized)
PACKED_CHUNK, REFERENCE_CHUNK = 16, 512
TEXT_TOKENS = 768  # the text's first tokens: 48 packed passes over a growing context


def next_token_logprobs(loaded, ids: list[int], chunk: int) -> torch.Tensor:
    """[len(ids), vocab] log-probabilities of each next token, `chunk` tokens a pass."""
    from radixrt.runtime.forward.forward_batch import ForwardBatch
    from radixrt.runtime.forward.kv_cache import KVCache

    kv = KVCache.from_config(loaded.config, len(ids) + 1, torch.float32, "cpu")
    table = list(range(len(ids)))
    out = []
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        batch = ForwardBatch.build([part], [start], [table[: start + len(part)]])
        logits = loaded.model.compute_logits(loaded.model.forward(batch, kv))
        out.append(torch.log_softmax(logits.double(), dim=-1))
    return torch.cat(out)


def test_the_default_model_packed_agrees_with_dequantized_on_english_text(loaded_model) -> None:
    """Over 768 tokens of English prose (tests/data/english.txt): top-1 agreement
    >= 98% and a mean KL divergence of the next-token distributions <= 0.01 nats, what
    llama.cpp's --kl-divergence measures (the packed products differ from the float ones only
    in their summation order here, so both are far inside the bounds). The packed model runs
    passes of 16 tokens, so its products are the packed kernels' (the fused decode step)."""
    from radixrt.runtime.models import load_model

    assert loaded_model.model.weight_formats().get("u4/g32/f16")  # the default: packed
    dense = load_model("default", weight_format="dequantized")
    ids = loaded_model.tokenizer(TEXT.read_text()).input_ids[:TEXT_TOKENS]
    assert len(ids) == TEXT_TOKENS
    ref = next_token_logprobs(dense, ids, REFERENCE_CHUNK)
    got = next_token_logprobs(loaded_model, ids, PACKED_CHUNK)
    kl = (ref.exp() * (ref - got)).sum(-1)  # KL(dequantized || packed) per position, nats
    agree = (ref.argmax(-1) == got.argmax(-1)).double().mean().item()
    assert agree >= 0.98 and kl.mean().item() <= 0.01, (agree, kl.mean().item())
