"""Each surface's image form as the chat path's (core/image_parts.py), without a server: SGLang's
image_data items and their per-prompt shapes, Anthropic's base64 sources, a turn's parts as a
chat message's content. (test_image_parts.py runs every surface against a real server.)"""

from __future__ import annotations

import pytest

from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.core.image_parts import (
    base64_url,
    chat_content,
    image_part,
    native_image_refs,
    sglang_ref,
    text_part,
)


def test_sglang_items_are_urls_paths_or_plain_base64() -> None:
    assert sglang_ref("data:image/png;base64,AAAA") == "data:image/png;base64,AAAA"
    assert sglang_ref("HTTPS://x/y") == "HTTPS://x/y"
    assert sglang_ref("file:///tmp/a.png") == "file:///tmp/a.png"
    assert sglang_ref("/tmp/pictures/cat.JPG") == "/tmp/pictures/cat.JPG"
    assert sglang_ref("iVBORw0KGgo=") == "data:;base64,iVBORw0KGgo="
    assert sglang_ref({"url": "http://x/y.png", "detail": "low"}) == "http://x/y.png"
    for bad in ("", "  ", {"detail": "low"}, 3):
        with pytest.raises(APIError, match="image_data item") as caught:
            sglang_ref(bad)
        assert caught.value.param == "image_data"


def test_image_data_per_prompt() -> None:
    one, two = "http://x/1.png", "http://x/2.png"
    assert native_image_refs(None, 2, batch=True) == [[], []]
    assert native_image_refs([], 1, batch=False) == [[]]
    assert native_image_refs(one, 1, batch=False) == [[one]]
    assert native_image_refs([one, two], 1, batch=False) == [[one, two]]
    assert native_image_refs([[one, two]], 1, batch=False) == [[one, two]]  # SGLang's nesting
    assert native_image_refs([one, [one, two], None], 3, batch=True) == [[one], [one, two], []]
    assert native_image_refs(one, 2, batch=True) == [[one], [one]]  # one image for each prompt
    with pytest.raises(APIError, match="2 entries for 3 prompts"):
        native_image_refs([one, two], 3, batch=True)


def test_a_turns_parts_become_the_chat_content() -> None:
    assert chat_content([text_part("a"), text_part("b")]) == "ab"  # text alone stays a string
    assert chat_content([]) == ""
    url = base64_url("image/png", "AAAA")
    assert url == "data:image/png;base64,AAAA"
    assert chat_content([text_part("Look:"), image_part(url)]) == [
        {"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": url}}]
