"""Text that is not Unicode, found wherever it hides in a JSON body (values and keys, nested),
named by its path; everything else passes untouched. The routes' answers are checked over HTTP
in test_http_server.py (the bad-input corpus)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.core.text_check import check_text, lone_surrogate_at

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)


@given(json_values)
def test_valid_text_passes(value: object) -> None:
    """hypothesis' text() is valid Unicode (it leaves surrogates out): never refused."""
    assert lone_surrogate_at(value) is None
    check_text(json.dumps(value).encode())


@pytest.mark.parametrize(("body", "path", "index"), [
    ('"\\ud800"', (), 0),
    ('{"prompt": "ab\\uDC00"}', ("prompt",), 2),
    ('{"messages": [{"content": "ok"}, {"content": [{"text": "x\\ud83d"}]}]}',
     ("messages", "1", "content", "0", "text"), 1),
    ('{"logit_bias": {"\\udfff": 1}}', ("logit_bias", "\\udfff"), 0),
])
def test_a_lone_surrogate_is_found_by_its_path(body: str, path: tuple, index: int) -> None:
    assert lone_surrogate_at(json.loads(body)) == (path, index)
    with pytest.raises(APIError) as refused:
        check_text(body.encode())
    assert refused.value.status == 400
    assert refused.value.param == (path[0] if path else None)
    assert f"{'.'.join(path) or 'body'}: the text is not valid Unicode" in refused.value.message
    refused.value.message.encode("utf-8")  # the message itself can be sent


def test_a_surrogate_pair_is_one_character_and_passes() -> None:
    check_text(b'{"prompt": "\\ud83d\\ude00"}')  # an emoji, spelled as a pair
    check_text(b'{"prompt": "not json')  # left to the route, which says it is not JSON
