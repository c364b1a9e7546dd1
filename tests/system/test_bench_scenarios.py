"""The benchmarks' arithmetic on made-up inputs: decode_bandwidth.py's bytes per step and
chunked_prefill.py's summary. Each script's run end to end: test_benchmarks_quick.py."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from chunked_prefill import summarize  # noqa: E402
from decode_bandwidth import StepBytes  # noqa: E402
from serving_requests import RequestResult  # noqa: E402


# --- arithmetic ----------------------------------------------------------------------------------
def test_step_bytes_count_the_head_once_and_the_kv_per_sequence() -> None:
    sb = StepBytes(layers=1000, final_norm=10, lm_head=500, embed_row=5, tied=True,
                   kv_per_token=2)
    assert sb.total(1, 0) == 1515
    assert sb.total(1, 100) == 1515 + 200
    assert sb.total(4, 100) == 1510 + 4 * (5 + 200)  # weights once, rows and KV per sequence


def test_summarize_splits_decoders_and_long_prompts() -> None:
    decoder = RequestResult(ok=True, output_tokens=11, ttft=0.1, e2e=1.1, itls=[0.1] * 10)
    long = RequestResult(ok=True, output_tokens=2, ttft=2.0, e2e=2.1, itls=[0.1])
    failed = RequestResult(error="boom")
    row = summarize(64, {"decoder": [decoder, decoder], "long": [long, failed]}, 5.0)
    assert row["ttft_mean"] == pytest.approx(2000.0)  # the long prompts' only
    assert row["itl_p99"] == pytest.approx(100.0)  # the decoders' only
    assert row["tpot_mean"] == pytest.approx(100.0) and row["tpot_p99"] == pytest.approx(100.0)
    assert row["failed"] == 1 and row["errors"] == ["boom"]
    assert row["decode_tok_s"] == pytest.approx(22 / 5.0)
