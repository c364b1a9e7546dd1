"""Images in HTTP requests: each surface's image form as the one the chat path takes, and a
request's images loaded and encoded, every refusal a 400 naming the field.

The forms, all ending as OpenAI's `{"type": "image_url", "image_url": {"url": ...}}` part of a
user message (or, for /generate, a ref beside a text prompt):
- OpenAI chat: that part itself (`detail` accepted and ignored);
- the Responses API: `{"type": "input_image", "image_url": <data: or http(s) URL>}`;
- Anthropic: `{"type": "image", "source": {"type": "base64", "media_type", "data"}}` (as a
  data: URL) or `{"type": "url", "url"}`;
- SGLang's /generate: `image_data`, per prompt one item or a list (a data: or http(s) URL, plain
  base64, a local path; SGLang's {"url": ...} objects too), the prompt writing the model's image
  token once per image.

What a URL may reach is the server's MediaPolicy's to say (TokenizerManager.load_images).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from radixrt.runtime.config import MAX_PATH_CHARS
from radixrt.runtime.errors import QueueFull
from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.core.http_streaming import queue_full
from radixrt.runtime.tokenizer.prompts import Prompt
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

NO_IMAGES = "this model takes no images: send text only, or serve a vision-language model"
URL_LIKE = re.compile(r"^(data|https?|file):", re.IGNORECASE)
IMAGE_FILE = re.compile(r"\.(png|jpe?g|webp|gif|bmp)$", re.IGNORECASE)


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def chat_content(parts: Sequence[Mapping[str, Any]]) -> str | list[dict[str, Any]]:
    """A turn's text_part / image_part pieces as a chat message's content: its text as one
    string when it has no image (as text-only turns always were), else the parts."""
    if not any(part["type"] == "image_url" for part in parts):
        return "".join(part["text"] for part in parts)
    return [dict(part) for part in parts]


def base64_url(media_type: str, data: str) -> str:
    """An Anthropic base64 source as a data: URL."""
    return f"data:{media_type};base64,{data}"


def sglang_ref(item: Any) -> str:
    """One image_data item as a ref media_fetch takes: URLs and paths as they are, SGLang's
    {"url": ...} by its url, anything else plain base64 (as SGLang reads it)."""
    ref = item.get("url") if isinstance(item, Mapping) else getattr(item, "url", item)
    if not isinstance(ref, str) or not ref.strip():
        raise APIError("an image_data item is a data: / http(s) URL, base64 or a path",
                       param="image_data")
    if URL_LIKE.match(ref) or (len(ref) <= MAX_PATH_CHARS and IMAGE_FILE.search(ref)):
        return ref
    return base64_url("", ref)


def native_image_refs(image_data: Any, count: int, batch: bool) -> list[list[str]]:
    """image_data as each prompt's refs: for one prompt an item or a list of items; for a batch
    one entry per prompt (an item, a list, or null), or one item for every prompt."""
    def items(entry: Any) -> list[str]:
        if entry is None:
            return []
        return [sglang_ref(i) for i in entry] if isinstance(entry, list) else [sglang_ref(entry)]

    if image_data is None or image_data == []:
        return [[] for _ in range(count)]
    if not batch:
        nested = isinstance(image_data, list) and len(image_data) == 1 and isinstance(
            image_data[0], list)
        return [items(image_data[0] if nested else image_data)]
    if not isinstance(image_data, list):
        return [items(image_data) for _ in range(count)]
    if len(image_data) != count:
        raise APIError(f"image_data has {len(image_data)} entries for {count} prompts: give "
                       "one per prompt (a list of images, or null)", param="image_data")
    return [items(entry) for entry in image_data]


async def load_images(manager: TokenizerManager, refs: Sequence[Any], param: str) -> list[Any]:
    """The images refs name (PIL images); APIError (400) when the model takes none, for too many,
    or for one that cannot be fetched, read or decoded; 429 when the server holds as many
    decoded images as it may (tokenizer/decoded_images.py)."""
    if not refs:
        return []
    if not manager.takes_images:
        raise APIError(NO_IMAGES, param=param)
    try:
        return await manager.load_images(refs)
    except ValueError as exc:
        raise APIError(str(exc), param=param) from None
    except QueueFull as exc:  # other requests' decoded images fill the server's bound
        raise queue_full(str(exc), exc.retry_after_s) from None


async def encode_with_images(manager: TokenizerManager, prompt: Prompt, images: Sequence[Any],
                             param: str) -> tuple[list[int], list[ImageInput]]:
    """The prompt's ids with its images' placeholders, and the images (none: encode as text)."""
    try:
        if not images:
            return manager.encode(prompt), []
        return await manager.encode_images(prompt, images)
    except ValueError as exc:
        raise APIError(str(exc), param=param) from None
