"""Images inside chat messages: the parts that carry them, taken out in order, and the
messages as the chat template takes them (each image a `{"type": "image"}` part, where the
template writes the model's image token).

A message's content may be a string or a list of parts; an image part is
`{"type": "image", "image": <PIL image | bytes | str>}` (the Engine's form; the str a data:,
http(s) URL or a path), OpenAI's `{"type": "image_url", "image_url": {"url": ...}}`, or the
`url` / `path` spellings of transformers' chat templates. The other surfaces (Anthropic,
Responses, SGLang's image_data) turn theirs into one of these at their edge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

IMAGE_PART_TYPES = ("image", "image_url")


def image_ref(part: Mapping[str, Any]) -> Any:
    """What an image part names: a PIL image, bytes, or a URL / path string."""
    if part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, Mapping) else url
        if not isinstance(url, str) or not url:
            raise ValueError("an image_url part needs {'image_url': {'url': ...}}")
        return url
    for key in ("image", "url", "path"):
        if part.get(key) is not None:
            return part[key]
    raise ValueError("an image part needs 'image' (an image, bytes, a URL or a path), 'url' or "
                     "'path'")


def has_images(messages: Sequence[Any]) -> bool:
    """Whether chat messages carry image parts (False for any other prompt: token ids)."""
    return any(isinstance(m, Mapping) and isinstance(m.get("content"), list)
               and any(isinstance(p, Mapping) and p.get("type") in IMAGE_PART_TYPES
                       for p in m["content"]) for m in messages)


def take_images(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """(messages with each image part as {"type": "image"}, the images' refs in order)."""
    refs: list[Any] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(dict(message))
            continue
        parts: list[Any] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES:
                refs.append(image_ref(part))
                parts.append({"type": "image"})
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return out, refs
