"""SamplingParams: validation, normalisation, hashing, with_()."""

from __future__ import annotations

import pickle
from typing import Any

import msgspec
import pytest

from radixrt.runtime.config import MAX_TOP_LOGPROBS
from radixrt.runtime.sampling_params import SamplingParams


def test_defaults_are_valid() -> None:
    p = SamplingParams()
    assert p.max_tokens is None and p.temperature == 1.0 and p.top_k == -1
    assert not p.is_greedy and p.stop == () and p.stop_token_ids == () and p.logit_bias is None
    assert SamplingParams(temperature=0).is_greedy


def test_the_one_default_rule_for_max_tokens() -> None:
    """Left out, max_tokens is the rest of the context, at most DEFAULT_MAX_TOKENS (at least 1):
    resolved when the request is queued, whatever its entry point."""
    from radixrt.runtime.config import DEFAULT_MAX_TOKENS
    from radixrt.runtime.sampling_params import default_max_tokens

    assert SamplingParams().resolved_max_tokens(10, 10_000) == DEFAULT_MAX_TOKENS
    assert SamplingParams().resolved_max_tokens(10, 100) == 90
    assert SamplingParams().resolved_max_tokens(100, 100) == 1
    assert SamplingParams(max_tokens=7).resolved_max_tokens(10, 100) == 7
    assert SamplingParams(max_tokens=0).resolved_max_tokens(10, 100) == 0  # prefill only
    assert default_max_tokens(10, 100) == 90
    with pytest.raises(ValueError, match="min_tokens=95"):
        SamplingParams(min_tokens=95).resolved_max_tokens(10, 100)  # past the resolved 90


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("max_tokens", -1, "must be >= 1, 0 (prefill only"),
        ("max_tokens", "5", "must be an int"),
        ("max_tokens", 5.0, "must be an int"),
        ("min_tokens", -1, "[0, max_tokens=None]"),
        ("temperature", -1.0, "must be >= 0 (0 means greedy)"),
        ("temperature", float("inf"), "finite"),
        ("temperature", float("nan"), "finite"),
        ("temperature", "1", "finite number"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_k", -2, "-1 or 0 (off) or >= 1"),
        ("top_k", True, "must be an int"),
        ("min_p", -0.1, "[0, 1]"),
        ("min_p", 1.1, "[0, 1]"),
        ("frequency_penalty", 2.5, "[-2.0, 2.0]"),
        ("presence_penalty", -2.5, "[-2.0, 2.0]"),
        ("repetition_penalty", 0.0, "> 0"),
        ("logit_bias", {-1: 1.0}, "int >= 0"),
        ("logit_bias", {"3": 1.0}, "int >= 0"),
        ("logit_bias", {3: 101.0}, "[-100.0, 100.0]"),
        ("logit_bias", {3: float("nan")}, "[-100.0, 100.0]"),
        ("logit_bias", [(3, 1.0)], "mapping"),
        ("stop", "", "non-empty str"),
        ("stop", ["ok", ""], "non-empty str"),
        ("stop", [1], "non-empty str"),
        ("stop", 5, "sequence of non-empty str"),
        ("stop_token_ids", [-1], "int >= 0"),
        ("stop_token_ids", 5, "sequence of token ids"),
        ("seed", 1.5, "int or None"),
        ("n", 0, "[1, 128]"),
        ("n", 129, "[1, 128]"),
        ("n", 2**70, "64 bits"),
        ("seed", 2**70, "64 bits"),
        ("seed", -(2**63) - 1, "64 bits"),
        ("top_k", 2**64, "64 bits"),
        ("max_tokens", 2**63, "64 bits"),
        ("prompt_logprobs_start", 2**70, "64 bits"),
        ("stop_token_ids", [2**70], "within 64 bits"),
        ("logit_bias", {2**70: 1.0}, "within 64 bits"),
        ("logprobs", 1, "must be a bool"),
        ("top_logprobs", MAX_TOP_LOGPROBS + 1, f"[0, {MAX_TOP_LOGPROBS}]"),
        ("top_logprobs", -1, f"[0, {MAX_TOP_LOGPROBS}]"),
        ("prompt_logprobs_start", -1, ">= 0 or None"),
        ("skip_special_tokens", None, "must be a bool"),
        ("ignore_eos", "yes", "must be a bool"),
    ],
)
def test_invalid_values_name_field_value_and_range(field: str, value: Any, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert message.startswith(f"{field}=")
    assert repr(value) in message
    assert fragment in message


def test_error_message_example() -> None:
    with pytest.raises(ValueError, match=r"^temperature=-1.0 is invalid: must be >= 0 \(0 means"):
        SamplingParams(temperature=-1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_k": 0}, {"top_k": 1}, {"top_p": 1e-9}, {"min_p": 1.0}, {"min_tokens": 16},
        {"frequency_penalty": -2}, {"presence_penalty": 2}, {"repetition_penalty": 0.5},
        {"logit_bias": {0: -100, 5: 100}}, {"seed": -3}, {"seed": 2**63 - 1},
        {"seed": -(2**63)}, {"n": 128}, {"top_logprobs": 20},
        {"prompt_logprobs_start": 0}, {"temperature": 0}, {"max_tokens": 1},
    ],
)
def test_boundary_values_are_accepted(kwargs: dict[str, Any]) -> None:
    SamplingParams(**kwargs)


def test_top_logprobs_does_not_require_logprobs() -> None:
    p = SamplingParams(top_logprobs=5)
    assert not p.logprobs and p.wants_logprobs


def test_normalisation() -> None:
    p = SamplingParams(stop="###", stop_token_ids=[3, 4], temperature=1, logit_bias={7: 2})
    assert p.stop == ("###",)
    assert p.stop_token_ids == (3, 4)
    assert isinstance(p.temperature, float)
    assert p.logit_bias == {7: 2.0} and isinstance(p.logit_bias[7], float)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(logit_bias={}).logit_bias is None


def test_hashable_and_equal() -> None:
    a = SamplingParams(logit_bias={1: 1.0, 2: -1.0}, stop=["x"], stop_token_ids=[5])
    b = SamplingParams(logit_bias={2: -1.0, 1: 1.0}, stop=("x",), stop_token_ids=(5,))
    assert a == b and hash(a) == hash(b)
    assert len({a, b, SamplingParams()}) == 2


def test_logit_bias_is_read_only() -> None:
    p = SamplingParams(logit_bias={1: 1.0})
    with pytest.raises(TypeError):
        p.logit_bias[2] = 3.0  # type: ignore[index]
    with pytest.raises(TypeError):
        p.logit_bias.update({2: 3.0})  # type: ignore[union-attr]
    source = {1: 1.0}
    q = SamplingParams(logit_bias=source)
    source[1] = 50.0
    assert q.logit_bias == {1: 1.0}


def test_round_trips_pickle_and_msgspec() -> None:
    p = SamplingParams(logit_bias={3: 1.5}, stop="END", seed=7, top_logprobs=2)
    assert pickle.loads(pickle.dumps(p)) == p
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p


def test_travels_typed_in_the_wire_messages() -> None:
    """SubmitRequest and WorkerRequest carry the Struct itself: decoded straight into
    SamplingParams (validated by its __post_init__); an unknown or ill-typed field is refused."""
    from radixrt.runtime.messages import SubmitRequest, WorkerRequest

    p = SamplingParams(max_tokens=0, prompt_logprobs_start=1, regex="[a-z]+", n=2)
    msg = SubmitRequest(rid=3, prompt_ids=[1, 2], params=p, grammar_ready=False)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(msg), type=SubmitRequest)
    assert back.params == p and isinstance(back.params, SamplingParams) and back.params.prefill_only
    work = WorkerRequest(rid=3, prompt_ids=[1], output_ids=[], params=p, max_tokens=0)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(work), type=WorkerRequest) == work
    raw = msgspec.msgpack.encode({"max_tokens": 3, "temprature": 0.5})
    with pytest.raises(msgspec.ValidationError, match="temprature"):
        msgspec.msgpack.decode(raw, type=SamplingParams)
    with pytest.raises(msgspec.ValidationError, match="top_p"):  # __post_init__'s check
        msgspec.msgpack.decode(msgspec.msgpack.encode({"top_p": 0.0}), type=SamplingParams)
    with pytest.raises(ValueError, match="unknown sampling option"):
        SamplingParams.from_fields({"temprature": 0.5})


def test_with_returns_validated_copy() -> None:
    p = SamplingParams(max_tokens=10)
    q = p.with_(temperature=0.0, stop="a")
    assert q.is_greedy and q.stop == ("a",) and q.max_tokens == 10
    assert p.temperature == 1.0
    with pytest.raises(ValueError, match="top_p"):
        p.with_(top_p=0.0)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=10, min_tokens=10).with_(max_tokens=5)
    with pytest.raises(TypeError, match="unknown sampling option"):
        p.with_(temprature=0.5)


def test_validate_for_vocab() -> None:
    SamplingParams(logit_bias={99: 1.0}, stop_token_ids=[99]).validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"logit_bias=.*token id 100 must be < vocab_size=100"):
        SamplingParams(logit_bias={100: 1.0}).validate_for_vocab(100)
    with pytest.raises(ValueError, match=r"stop_token_ids=\(1, 200\).*vocab_size=100"):
        SamplingParams(stop_token_ids=[1, 200]).validate_for_vocab(100)


def test_frozen() -> None:
    p = SamplingParams()
    with pytest.raises(AttributeError):
        p.temperature = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"stop": ["x"] * 17}, "at most 16"),
        ({"stop": ["x" * 257]}, "at most 256"),
        ({"stop_token_ids": [1] * 257}, "at most 256"),
        ({"logit_bias": {i: 1.0 for i in range(1025)}}, "at most 1024"),
        ({"choices": ["a"] * 257}, "at most 256"),
        ({"regex": "a" * (1 << 16 | 1)}, "at most 65536"),
        ({"json_schema": "{" + " " * (1 << 20) + "}"}, "at most 1048576"),
        ({"choices": ["x" * 40000, "y" * 40000]}, "at most 65536"),
    ],
)
def test_lists_and_strings_are_bounded(kwargs: dict[str, Any], fragment: str) -> None:
    """Sizes are checked when the params are built, before anything is allocated for them."""
    with pytest.raises(ValueError, match=fragment) as info:
        SamplingParams(**kwargs)
    assert next(iter(kwargs)) in str(info.value)


def test_the_largest_allowed_lists_and_strings_are_accepted() -> None:
    params = SamplingParams(stop=["x" * 256] * 16, stop_token_ids=[1] * 256,
                            logit_bias={i: 1.0 for i in range(1024)})
    assert len(params.stop) == 16 and len(params.stop_token_ids) == 256
    assert len(SamplingParams(choices=[str(i) for i in range(256)]).choices) == 256
