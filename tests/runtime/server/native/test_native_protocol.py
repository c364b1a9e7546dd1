"""SGLang's /generate wire shapes without a server: sampling names, the fields radixrt does not
serve, per-prompt values, finish_reason objects and logprob triples."""

from __future__ import annotations

from typing import Any

import pytest

from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.native.native_protocol import (
    GenerateRequest,
    check_unserved,
    finish_reason,
    logprob_triples,
    per_prompt,
    sampling_values,
    top_triples,
)


def test_sglang_names_become_sampling_params_fields() -> None:
    values = sampling_values({"max_new_tokens": 5, "min_new_tokens": 2, "sampling_seed": 3,
                              "stop_token_ids": [7, 8], "logit_bias": {"4": 1.5},
                              "top_k": None, "spaces_between_special_tokens": True,
                              "skip_special_tokens": False})
    assert values == {"max_tokens": 5, "min_tokens": 2, "seed": 3, "stop_token_ids": (7, 8),
                      "logit_bias": {4: 1.5}, "skip_special_tokens": False}


@pytest.mark.parametrize(("values", "expect"), [
    ({"stop_regex": "a+"}, "stop_regex"),
    ({"no_stop_trim": True}, "no_stop_trim"),
    ({"structural_tag": "{}"}, "structural_tag"),
    ({"stream_interval": 4}, "stream_interval"),
    ({"beam_width": 2}, "beam_width"),
    ({"tempreature": 0.5}, "unknown sampling_params field 'tempreature'"),
    ({"seed": 1, "sampling_seed": 1}, "twice"),
])
def test_what_is_not_served_is_named(values: dict[str, Any], expect: str) -> None:
    with pytest.raises(APIError, match=expect):
        sampling_values(values)


def test_unserved_request_fields_pass_only_when_off() -> None:
    check_unserved(GenerateRequest(text="x", lora_path=None, image_data=[], log_metrics=False,
                                   return_routed_experts=False))
    for name, value in (("lora_id", "a"), ("video_data", ["v"]), ("background", True),
                        ("return_routed_experts", 1), ("token_ids_logprob", [3])):
        with pytest.raises(APIError, match=name):
            check_unserved(GenerateRequest(text="x", **{name: value}))


def test_per_prompt_values() -> None:
    assert per_prompt(3, 2, "top_logprobs_num", batch=True) == [3, 3]
    assert per_prompt([1, 2], 2, "top_logprobs_num", batch=True) == [1, 2]
    with pytest.raises(APIError, match="3 entries for 2 prompts"):
        per_prompt([1, 2, 3], 2, "rid", batch=True)
    with pytest.raises(APIError, match="one prompt"):
        per_prompt([1], 1, "rid", batch=False)


def test_finish_reasons_as_sglang_writes_them() -> None:
    eos = frozenset({2})
    assert finish_reason(None, None, [5], eos) is None
    assert finish_reason("stop", "END", [5, 6], eos) == {"type": "stop", "matched": "END"}
    assert finish_reason("stop", None, [5, 2], eos) == {"type": "stop", "matched": 2}
    assert finish_reason("length", None, [5, 6, 7], eos) == {"type": "length", "length": 3}
    assert finish_reason("abort", None, [], eos)["type"] == "abort"  # type: ignore[index]


def test_logprob_triples_with_and_without_text() -> None:
    assert logprob_triples([(None, 4), (-0.5, 5)], None) == [[None, 4, None], [-0.5, 5, None]]
    assert logprob_triples([(-0.5, 5)], lambda t: f"<{t}>") == [[-0.5, 5, "<5>"]]
    tops = top_triples([None, TokenLogprob(5, -0.5, [(5, -0.5), (6, -1.0)])], None)
    assert tops == [None, [[-0.5, 5, None], [-1.0, 6, None]]]
