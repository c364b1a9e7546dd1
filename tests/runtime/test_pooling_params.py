"""Pooling requests' params (no model): every field checked with a message that names it, the
checks against what a served model offers, and the wire form of pooled vectors."""

from __future__ import annotations

import math

import msgspec
import pytest

from radixrt.runtime.messages import OutputDelta, RunResult
from radixrt.runtime.pooling_params import (
    Pooling,
    PoolingInfo,
    check_pooling,
    pack_floats,
    sigmoid,
    softmax,
    unpack_floats,
)
from radixrt.runtime.sampling_params import SamplingParams

EMBEDDER = PoolingInfo(mode="last", normalize=True, hidden_size=64)
CLASSIFIER = PoolingInfo(hidden_size=64, num_labels=3, labels=("a", "b", "c"), generates=False,
                         task="classify")
RERANKER = PoolingInfo(hidden_size=64, task="rerank", rerank_tokens=(7, 9))


@pytest.mark.parametrize("fields, message", [
    (dict(task="tokens"), "pooling task 'tokens' is invalid"),
    (dict(task="embed", mode="max"), "pooling mode 'max' is invalid"),
    (dict(task="embed", dimensions=0), "dimensions=0 is invalid"),
    (dict(task="embed", dimensions=True), "dimensions=True is invalid"),
    (dict(task="embed", normalize="yes"), "normalize='yes' must be a bool"),
    (dict(task="embed", label_tokens=(1,)), "label_tokens belong to task 'classify'"),
    (dict(task="classify", label_tokens=tuple(range(17))), "at most 16 token ids"),
    (dict(task="classify", label_tokens=(-1,)), "at most 16 token ids"),
])
def test_bad_pooling_fields_are_refused_by_name(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Pooling(**fields)


def test_a_pooling_request_generates_nothing() -> None:
    spec = Pooling("embed")
    assert SamplingParams(max_tokens=0, pooling=spec).prefill_only
    with pytest.raises(ValueError, match="max_tokens=None is invalid: must be 0"):
        SamplingParams(pooling=spec)
    with pytest.raises(ValueError, match="n=2 is invalid: must be 1"):
        SamplingParams(max_tokens=0, n=2, pooling=spec)
    with pytest.raises(ValueError, match="regex does not apply"):
        SamplingParams(max_tokens=0, regex="a+", pooling=spec)
    with pytest.raises(ValueError, match="prompt_logprobs_start=0 is invalid: must be None"):
        SamplingParams(max_tokens=0, prompt_logprobs_start=0, pooling=spec)


def test_pooling_params_travel_typed() -> None:
    """Decoded on the far side of a socket into the same classes, checks run again."""
    params = SamplingParams(max_tokens=0, pooling=Pooling("classify", label_tokens=[3, 4]))
    wire = msgspec.msgpack.encode(params)
    back = msgspec.msgpack.decode(wire, type=SamplingParams)
    assert back == params and back.pooling.label_tokens == (3, 4)
    bad = msgspec.msgpack.encode({"max_tokens": 0, "pooling": {"task": "embed", "mode": "max"}})
    with pytest.raises(msgspec.ValidationError, match="pooling mode"):
        msgspec.msgpack.decode(bad, type=SamplingParams)
    assert Pooling("embed", mode="mean").whole_prompt and not Pooling("embed").whole_prompt


def test_requests_are_checked_against_what_the_model_offers() -> None:
    check_pooling(Pooling("embed", dimensions=64), EMBEDDER, 100)
    with pytest.raises(ValueError, match="dimensions=65 is more than the model's 64"):
        check_pooling(Pooling("embed", dimensions=65), EMBEDDER, 100)
    with pytest.raises(ValueError, match="no classification head"):
        check_pooling(Pooling("classify"), EMBEDDER, 100)
    with pytest.raises(ValueError, match="does not generate"):
        check_pooling(None, CLASSIFIER, 100)
    check_pooling(Pooling("classify"), CLASSIFIER, 100)
    with pytest.raises(ValueError, match="this model has a classification head"):
        check_pooling(Pooling("classify", label_tokens=(7, 9)), CLASSIFIER, 100)
    check_pooling(Pooling("classify", label_tokens=(7, 9)), RERANKER, 100)
    with pytest.raises(ValueError, match=r"label_tokens \[100\] are outside the vocabulary"):
        check_pooling(Pooling("classify", label_tokens=(7, 100)), RERANKER, 100)
    check_pooling(None, RERANKER, 100)  # a reranking LM still generates


def test_vectors_cross_as_float32_bytes() -> None:
    values = [0.5, -1.25, 3.0e-8, 1e6]
    data = pack_floats(values)
    assert len(data) == 16 and unpack_floats(data) == pytest.approx(values, rel=1e-7)
    for cls in (RunResult(rid=1, pooled=data), OutputDelta(rid=1, owner=1, index=0, pooled=data)):
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(cls), type=type(cls)).pooled == data


def test_scores_from_logits() -> None:
    assert softmax([0.0, 0.0]) == [0.5, 0.5]
    assert softmax([1000.0, 0.0])[0] == 1.0  # no overflow
    assert sum(softmax([1.0, 2.0, 3.0])) == pytest.approx(1.0)
    assert sigmoid(0.0) == 0.5
    assert sigmoid(-1000.0) == 0.0 and sigmoid(1000.0) == 1.0
    assert sigmoid(2.0) == pytest.approx(1 / (1 + math.exp(-2.0)))
    # two-way softmax of [no, yes] is the sigmoid of their difference
    assert softmax([0.3, 1.7])[1] == pytest.approx(sigmoid(1.4))
