"""Multi-head latent attention (models/mla.py) and DeepSeek-MoE beyond the family test
(test_decoder_families.py runs the tiny DeepSeek-V2-Lite, V3 and GLM-4.5 against transformers
under the radix cache, pages of 16, chunked prefill and both preemptions):

- the absorbed form over the latent cache equals the textbook expanded form, chunk by chunk;
- the pool holds one latent row per token and layer: its bytes per token, and `radixrt plan`'s
  for DeepSeek-V3's own config (70,272 bytes in bf16 over 61 layers);
- tensor parallelism: tp 2 (the heads split, the latent replicated) equals tp 1, bitwise on
  every rank, within 1e-5 of tp 1;
- speculative decoding from the radix tree verifies and accepts drafts with transformers'
  tokens; the triton backend (the latent kernels, in the interpreter) gives the torch
  backend's tokens;
- DeepSeek's grouped routing picks only experts of the best groups."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_ranks import run_ranks
from safetensors.torch import load_file
from tiny_models import build_tiny, cached_scorer

from radixrt import Engine, SamplingParams
from radixrt.cli import main
from radixrt.runtime.distributed.group import TPGroup
from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.forward.kv_cache import KVCache
from radixrt.runtime.models import load_model
from radixrt.runtime.models.loader import _build
from radixrt.runtime.models.mla import LatentAttention
from radixrt.runtime.models.moe import Routing, route
from radixrt.runtime.models.registry import model_config
from radixrt.runtime.worker.capacity import kv_bytes_per_token

pytestmark = pytest.mark.model

LATENT = ["deepseek-v2-lite", "deepseek-v3"]
CPU = torch.device("cpu")
PROMPT = ("You are a careful assistant. Read the question and answer in one short sentence. "
          "Question: what do bees make?")
# DeepSeek-V3's config.json, the fields `radixrt plan` reads (deepseek-ai/DeepSeek-V3)
V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid",
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory,
                tokenizer: Any) -> Iterator[Callable[[str], tuple[Path, Any]]]:
    built: dict[str, tuple[Path, Any]] = {}

    def get(name: str) -> tuple[Path, Any]:
        if name not in built:
            folder = tmp_path_factory.mktemp(f"latent_{name}")
            built[name] = (folder, build_tiny(name, folder, tokenizer, seed=11))
        return built[name]

    yield get


@pytest.mark.parametrize("name", LATENT)
@torch.no_grad()
def test_absorbed_attention_equals_the_expanded_form(
        name: str, checkpoints: Callable[[str], tuple[Path, Any]]) -> None:
    """Every layer's attention over a 40-token sequence, prefilled in chunks of 13 through the
    latent cache (the absorbed form), equals the expanded per-head keys and values."""
    model = load_model(str(checkpoints(name)[0])).model
    config = model.config
    x = torch.randn(40, config.hidden_size, generator=torch.Generator().manual_seed(2))
    rope = model.rotary.cos_sin(torch.arange(40), x.dtype)
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(3))[:40]
    kv = KVCache.from_config(config, 64, torch.float32, "cpu")
    assert kv.parts == 1 and kv.buffer.shape[-1] == config.kv_lora_rank + config.qk_rope_head_dim
    for layer in model.layers:
        attn = layer.self_attn
        assert isinstance(attn, LatentAttention)
        expected = attn.o_proj(attn.expanded_attention(x, rope))
        got = []
        for start in range(0, 40, 13):
            end = min(start + 13, 40)
            batch = ForwardBatch.build([[0] * (end - start)], [start], [slots])
            model.attn_backend.init_forward(batch)
            piece = (rope[0][start:end], rope[1][start:end])
            got.append(attn(x[start:end], piece, kv, batch))
        torch.testing.assert_close(torch.cat(got), expected, atol=1e-5, rtol=1e-5)


def test_the_pool_holds_one_latent_row_per_token(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSeek-V3's KV: (512 + 64) dims x 61 layers x 2 bytes = 70,272 per token in bf16,
    against 128 heads x (192 + 128) x 61 x 2 = 4,997,120 for per-head K and V (71x); `radixrt
    plan` prints it and V3's active parameters (37.5 B of 671 B, as DeepSeek states them,
    without the multi-token-prediction layer)."""
    config = model_config(V3_CONFIG)
    assert config.kv_layout.kv_parts == 1 and config.kv_layout.head_dim == 576
    assert kv_bytes_per_token(config.kv_layout, 2) == 70_272 == 61 * 576 * 2
    (tmp_path / "config.json").write_text(json.dumps(V3_CONFIG))
    plan = ["plan", "--model", str(tmp_path), "--memory", "1400GiB", "--dtype", "bfloat16"]
    assert main(plan) == 0
    assert "KV cache: 70272 bytes per token (69 KiB; latent: (512 + 64) dims x 61 layers" in (
        capsys.readouterr().out)
    assert main([*plan, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["kv_bytes_per_token"] == 70_272
    assert 671e9 < figures["parameters"] < 672e9
    assert 36.5e9 < figures["active_parameters"] < 38e9


@pytest.mark.parametrize("name", [*LATENT, "glm4-moe"])
def test_tensor_parallel_equals_one_rank(name: str,
                                         checkpoints: Callable[[str], tuple[Path, Any]]) -> None:
    """tp 2 from the same checkpoint: each rank holds two of the four heads (and half of every
    expert) and the whole latent cache; a prefill and three decode steps give every rank the
    same logits, within 1e-5 of one rank's."""
    folder = checkpoints(name)[0]
    config = model_config(json.loads((folder / "config.json").read_text()))
    weights = list(load_file(str(folder / "model.safetensors")).items())

    def logits(tp: TPGroup) -> torch.Tensor:
        model = _build(config, torch.float32, CPU, "torch", weights, tp)
        kv = KVCache.from_config(model.shard.kv_shape(config), 48, torch.float32, "cpu")
        tables = [torch.arange(0, 20), torch.arange(24, 44)]
        prompts = [[5, 100, 7, 51, 17, 99, 33], [50, 1, 77, 26]]
        rows = [model.compute_logits(model.forward(ForwardBatch.build(prompts, [0, 0], tables),
                                                   kv))]
        lens = [7, 4]
        for tokens in ([64, 8], [100, 34], [2, 67]):
            batch = ForwardBatch.build([[t] for t in tokens], lens, tables)
            rows.append(model.compute_logits(model.forward(batch, kv)))
            lens = [n + 1 for n in lens]
        return torch.cat(rows)

    single = logits(TPGroup.single())
    outs = run_ranks(2, logits)
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0], single, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", LATENT)
def test_speculation_and_the_triton_backend_keep_transformers_tokens(
        name: str, checkpoints: Callable[[str], tuple[Path, Any]]) -> None:
    """The same prompt twice: the second run drafts its tokens from the tree (the first run's
    output) and accepts them, each token transformers' argmax within 1e-3; a third run on the
    triton backend (the latent kernels) gives the same tokens."""
    folder, hf = checkpoints(name)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=True)
    engine = Engine(load_model(str(folder)), max_total_tokens=512, check_integrity=True)
    try:
        first, second = (engine.generate([PROMPT], params)[0] for _ in range(2))
        stats = engine.stats()
    finally:
        engine.close()
    assert stats["spec_accepted_tokens"] > 0 and second.token_ids == first.token_ids
    ref = cached_scorer(hf)(second.prompt_token_ids + second.token_ids)
    n = second.prompt_tokens
    for i, lp in enumerate(second.logprobs):
        assert int(ref[n - 1 + i].argmax()) == lp.token_id
        assert abs(lp.logprob - ref[n - 1 + i][lp.token_id].item()) < 1e-3
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    triton = Engine(load_model(str(folder), attention_backend="triton"), max_total_tokens=512,
                    check_integrity=True)
    try:
        third = triton.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0,
                                                         ignore_eos=True))[0]
    finally:
        triton.close()
    assert third.token_ids == first.token_ids[:4]


def test_grouped_routing_keeps_to_the_best_groups() -> None:
    """V3's routing: 8 experts in 4 groups, 2 groups kept (by their two best scores with the
    correction bias), top 2 of them; the weights are the sigmoid scores without the bias,
    renormalised and scaled. V2's: softmax, the best expert's group."""
    logits = torch.tensor([[4.0, -9.0, 3.0, 3.0, -1.0, 0.0, 5.0, -8.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -3.0, 0.0])
    v3 = Routing(2, "sigmoid_topk", True, 4, 2, 2.5)
    ids, weights = route(logits, v3, bias)
    # groups by their two best (with the bias): [0,1]: .98+.00, [2,3]: .95+.95, [4,5]: .27+.5,
    # [6,7]: (.99-3)+.00: groups [2,3] and [0,1] kept; their best: 0, then 2 or 3 (a tie)
    assert set(ids[0].tolist()) in ({0, 2}, {0, 3})
    scores = logits.sigmoid()[0, ids[0]]
    torch.testing.assert_close(weights[0], scores / scores.sum() * 2.5)
    v2 = Routing(2, "softmax_topk", False, 4, 1, 1.0)
    ids, weights = route(logits, v2)  # the group of the best expert (6) alone
    assert set(ids[0].tolist()) == {6, 7}
    torch.testing.assert_close(weights[0], logits.softmax(-1)[0, ids[0]])


def test_the_latent_pool_moves_through_the_host_and_disk_tiers(
        checkpoints: Callable[[str], tuple[Path, Any]], tmp_path: Path) -> None:
    """A pool of 256 tokens under five 60-word documents asked twice: with a host tier and a
    disk tier under it, the second round's prefixes come back from them (the latent rows
    moved device -> host -> disk -> device) and the outputs are the outputs without tiers;
    a new Engine on the same disk directory restores them (a latent pool's own fingerprint)."""
    model = load_model(str(checkpoints("deepseek-v3")[0]))
    words = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
             "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau",
             "upsilon")
    docs = [f"Notes {i}: " + " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(60))
            + "\nSummary:" for i in range(5)]
    params = SamplingParams(max_tokens=5, temperature=0, logprobs=True)

    def ask(**options: Any) -> tuple[list[Any], dict[str, Any]]:
        engine = Engine(model, max_total_tokens=256, check_integrity=True, **options)
        try:
            outs = [engine.generate([d], params)[0] for _ in range(2) for d in docs]
            return outs, engine.stats()
        finally:
            engine.close()

    off, _ = ask()
    tiers = dict(host_cache_tokens=160, disk_cache_dir=str(tmp_path), disk_cache_tokens=4096)
    on, stats = ask(**tiers)
    for a, b in zip(off, on, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(p.logprob - q.logprob) for p, q in zip(a.logprobs, b.logprobs)) < 1e-4
    moved = stats["kv_tiers"]["moved_tokens"]
    assert moved.get("device->host", 0) > 0 and moved.get("host->disk", 0) > 0, stats["kv_tiers"]
    assert stats["kv_tiers"]["disk"]["hit_tokens"] > 0
    warm = Engine(model, max_total_tokens=256, check_integrity=True, **tiers)
    try:
        assert warm.stats()["kv_tiers"]["restored_tokens"] > 0
    finally:
        warm.close()


def test_int8_quantization_packs_the_latent_projections(
        checkpoints: Callable[[str], tuple[Path, Any]]) -> None:
    """--quantization int8 on a latent model: q_a, q_b, kv_a and o hold int8 groups of 32 (where
    their input dims make whole groups: q_b's 48 and o's 80 do not, here), kv_b stays in floats
    (folded into the query), and the next-token distributions stay near the float model's."""
    folder = checkpoints("deepseek-v3")[0]
    dense, quantized = load_model(str(folder)), load_model(str(folder), quantization="int8")
    attn = quantized.model.layers[1].self_attn
    for proj in (attn.q_a_proj, attn.q_b_proj, attn.kv_a_proj_with_mqa, attn.o_proj):
        whole = proj.in_features % 32 == 0
        assert proj.packed is not None and proj.packed.formats == (
            ["i8/g32/f16"] if whole else ["float32"])
    assert attn.q_a_proj.in_features % 32 == 0  # (at least one of them packs)
    assert attn.kv_b_proj.packed is None and attn.kv_b_proj.weight.dtype == torch.float32
    ids = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(1)).tolist()

    def logprobs(loaded: Any) -> torch.Tensor:
        kv = KVCache.from_config(loaded.config, 64, torch.float32, "cpu")
        batch = ForwardBatch.build([ids], [0], [list(range(len(ids)))])
        with torch.no_grad():
            hidden = loaded.model(batch, kv)
        return torch.log_softmax(loaded.model.compute_logits(hidden).double(), -1)

    ref, got = logprobs(dense), logprobs(quantized)
    # 0.024 measured; the tiny Qwen3-MoE measures 0.015 the same way (a close routing choice
    # flips under int8), the dense tiny Llama 0.0014; a projection loaded wrong is far above 1
    assert (ref.exp() * (ref - got)).sum(-1).mean().item() <= 0.05


@torch.no_grad()
def test_bf16_routes_as_transformers_does(checkpoints: Callable[[str], tuple[Path, Any]]) -> None:
    """In bfloat16 the router's weight and V3's correction bias stay float32 (as transformers
    keeps them), so 64 tokens' chosen experts and weights are transformers' router's."""
    from transformers import AutoModelForCausalLM

    folder = checkpoints("deepseek-v3")[0]
    ours = load_model(str(folder), dtype="bfloat16").model.layers[1].mlp
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).model.layers[1].mlp
    assert ours.gate.weight.dtype == ours.score_correction_bias.dtype == torch.float32
    x = torch.randn(64, ours.gate.in_features, generator=torch.Generator().manual_seed(4))
    x = x.to(torch.bfloat16)
    logits = torch.nn.functional.linear(x.float(), ours.gate.weight)
    ids, weights = route(logits, ours.routing, ours.score_correction_bias)
    _, ref_weights, ref_ids = theirs.gate(x)
    order, ref_order = ids.sort(-1), ref_ids.sort(-1)
    assert torch.equal(order.values, ref_order.values)
    torch.testing.assert_close(weights.gather(1, order.indices),
                               ref_weights.float().gather(1, ref_order.indices))


def test_forked_samples_copy_the_latent_page_they_share(
        checkpoints: Callable[[str], tuple[Path, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """n = 2 on pages of 16: the two samples share the prompt's pages and each copies the
    partly filled last one before writing its own latent rows (copy-on-write); greedy, both
    equal the n = 1 answer, and the pool is clean after."""
    copied: list[int] = []
    copy_slots = KVCache.copy_slots

    def spy(self: KVCache, src: torch.Tensor, dst: torch.Tensor) -> None:
        assert self.parts == 1
        copied.append(int(src.numel()))
        copy_slots(self, src, dst)

    monkeypatch.setattr(KVCache, "copy_slots", spy)
    engine = Engine(load_model(str(checkpoints("deepseek-v3")[0])), max_total_tokens=512,
                    page_size=16, check_integrity=True)
    try:
        one = engine.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0))[0]
        two = engine.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0, n=2))[0]
        stats = engine.stats()
    finally:
        engine.close()
    assert [s.token_ids for s in two.samples] == [one.token_ids] * 2
    assert stats["kv_private"] == stats["kv_locked"] == 0
    assert copied and all(0 < n < 16 for n in copied), copied  # the shared last page's rows
