"""The DSL endpoint's images, without a model: the text that stands for an image is what the
chat template writes for an image part (the bare image token where it writes none), and a
request's images are refused clearly where they cannot go. A live runtime with images:
tests/frontend/lang/test_api_images.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import jinja2
import pytest
from tiny_vlms import CHAT_TEMPLATE

from radixrt.runtime.messages import DslRequest
from radixrt.runtime.server.dsl.dsl_images import image_text, request_prompt

IMAGES_FIRST = (  # LLaVA-1.5's own template's way: a message's images before its text
    "{% for m in messages %}USER: {% for c in m.content if c.type == 'image' %}<image>\n"
    "{% endfor %}{% for c in m.content if c.type == 'text' %}{{ c.text }}{% endfor %}"
    "{% endfor %}")
STRINGS_ONLY = "{% for m in messages %}<|user|>{{ m.content }}<|end|>{% endfor %}"
REFUSES_PARTS = ("{% for m in messages %}{% if m.content is not string %}"
                 "{{ raise_exception('text only') }}{% endif %}{{ m.content }}{% endfor %}")
NO_IMAGE_TOKEN = ("{% for m in messages %}{% for c in m.content %}{% if c.type == 'image' %}"
                  "[picture]{% else %}{{ c.text }}{% endif %}{% endfor %}{% endfor %}")


class Templated:
    """A tokenizer's chat template rendering, as transformers renders it (jinja2)."""

    def __init__(self, source: str | None) -> None:
        self.chat_template = source

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool,
                            add_generation_prompt: bool) -> str:
        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        template = jinja2.Environment().from_string(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               raise_exception=raise_exception)


@pytest.mark.parametrize(("template", "written"), [
    (CHAT_TEMPLATE, "<image>\n"), (IMAGES_FIRST, "<image>\n"), (STRINGS_ONLY, "<image>"),
    (REFUSES_PARTS, "<image>"), (NO_IMAGE_TOKEN, "<image>"), (None, "<image>")])
def test_an_image_is_written_as_the_chat_template_writes_it(template, written):
    assert image_text(Templated(template), "<image>") == written


def test_images_are_refused_where_they_cannot_go():
    text_only = SimpleNamespace(takes_images=False, encode=lambda p: [1, 2])
    assert asyncio.run(request_prompt(text_only, DslRequest(call_id=1, text="hi"))) == ([1, 2],
                                                                                        [])
    with pytest.raises(ValueError, match="takes no images"):
        asyncio.run(request_prompt(text_only, DslRequest(call_id=1, text="<image>",
                                                         images=[b"\x89PNG"])))
    with pytest.raises(ValueError, match="not `input_ids`"):
        asyncio.run(request_prompt(text_only, DslRequest(call_id=1, input_ids=[5],
                                                         images=[b"\x89PNG"])))
    with pytest.raises(ValueError, match="give `text` or `input_ids`"):
        asyncio.run(request_prompt(text_only, DslRequest(call_id=1)))
