"""KV tiers on the real default model: with a pool far smaller than the prompts' working set, the
outputs with host and disk tiers are the outputs without them (greedy tokens identical, logprobs
within 1e-4), with page sizes 1 and 16, overlap and preemption by swap, while prefixes really are
served from the tiers; and a warm restart (a new Engine on the same disk directory) serves the
earlier prompts from the disk tier, but never a page whose write was torn."""

from __future__ import annotations

import os

import pytest

from radixrt import SamplingParams
from radixrt.runtime.worker.disk_format import rank_file, read_header, scan_file

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon"]
DOCS = [f"Notes {i}: " + " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(60))
        + "\nSummary:" for i in range(5)]
PARAMS = SamplingParams(max_tokens=6, temperature=0, logprobs=True)
POOL = 256  # tokens: about two of the documents


def ask_twice(engine) -> list:
    """Every document, then every document again (the second round's prefixes were evicted)."""
    return [engine.generate([doc], PARAMS)[0] for _ in range(2) for doc in DOCS]


def assert_same(off, on) -> None:
    for a, b in zip(off, on, strict=True):
        x, y = a.samples[0], b.samples[0]
        assert x.token_ids == y.token_ids
        assert max(abs(p.logprob - q.logprob) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_outputs_are_identical_with_host_and_disk_tiers(make_engine, tmp_path, page_size: int,
                                                        overlap: bool) -> None:
    base = dict(max_total_tokens=POOL, page_size=page_size, overlap=overlap)
    off_engine = make_engine(**base)
    off = ask_twice(off_engine)
    assert off_engine.stats()["kv_tiers"] is None
    host = make_engine(host_cache_tokens=4096, **base)
    assert_same(off, ask_twice(host))
    tiers = host.stats()["kv_tiers"]
    assert tiers["host"]["hit_tokens"] > 300 and tiers["moved_tokens"]["device->host"] > 0
    assert host.stats()["cached_tokens"] > off_engine.stats()["cached_tokens"] + 300
    both = make_engine(host_cache_tokens=160, disk_cache_dir=str(tmp_path / "kv"),
                       disk_cache_tokens=4096, **base)
    assert_same(off, ask_twice(both))
    tiers = both.stats()["kv_tiers"]
    assert tiers["disk"]["hit_tokens"] > 0 and tiers["moved_tokens"]["host->disk"] > 0
    assert oct(os.stat(tmp_path / "kv").st_mode & 0o777) == "0o700"


def test_outputs_are_identical_under_swap_preemption_with_tiers(make_engine) -> None:
    prompts = [doc[:60] for doc in DOCS[:4]]  # four requests that outgrow the pool together
    params = SamplingParams(max_tokens=40, temperature=0, logprobs=True, ignore_eos=True)
    base = dict(max_total_tokens=96, preemption="swap", schedule_policy="fcfs")
    off = make_engine(**base).generate(prompts, params)
    engine = make_engine(host_cache_tokens=2048, **base)
    on = engine.generate(prompts, params)
    assert_same(off, on)
    assert engine.stats()["preemptions"] > 0


def test_a_warm_restart_serves_the_disk_tier(make_engine, tmp_path) -> None:
    tiers = dict(max_total_tokens=POOL, host_cache_tokens=128, disk_cache_dir=str(tmp_path),
                 disk_cache_tokens=4096)
    cold = make_engine(**tiers)
    first = [cold.generate([doc], PARAMS)[0] for doc in DOCS]
    cold.close()  # the cache goes to the disk tier
    warm = make_engine(**tiers)
    restored = warm.stats()["kv_tiers"]["restored_tokens"]
    assert restored >= sum(len(o.prompt_token_ids) for o in first) - 5 * 2
    again = [warm.generate([doc], PARAMS)[0] for doc in DOCS]
    assert_same(first, again)
    stats = warm.stats()
    assert stats["cached_tokens"] >= 0.9 * stats["prompt_tokens"]
    assert stats["kv_tiers"]["disk"]["hit_tokens"] > 0
    warm.close()
    # torn writes: half the pages' data damaged after their records were written
    path = rank_file(str(tmp_path), 0)
    pages = sorted(scan_file(path))
    assert len(pages) >= restored
    fd = os.open(path, os.O_RDWR)
    try:
        head = read_header(fd)
        assert head is not None
        for page in pages[1::2]:
            os.pwrite(fd, b"\x00\x01torn", head[0].data_offset_of(page) + 64)
    finally:
        os.close(fd)
    torn = make_engine(**tiers)
    assert torn.stats()["kv_tiers"]["restored_tokens"] < restored / 2 + 10
    assert_same(first, [torn.generate([doc], PARAMS)[0] for doc in DOCS])


def test_a_second_engine_on_the_same_directory_is_refused(make_engine, tmp_path) -> None:
    tiers = dict(max_total_tokens=POOL, disk_cache_dir=str(tmp_path), disk_cache_tokens=512)
    make_engine(**tiers)
    with pytest.raises(RuntimeError, match="in use by another server"):
        make_engine(**tiers)
