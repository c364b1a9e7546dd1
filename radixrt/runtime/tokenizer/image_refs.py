"""The images an in-process caller (the Engine, a DSL program run locally) passes: its own
objects and files, trusted as the caller's code is; URLs go through the same checks as a
server's (tokenizer/media_fetch.py)."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.tokenizer.media_fetch import MediaPolicy, load_image

CALLER_POLICY = MediaPolicy(allowed_local_path="/")  # the caller's files; no private hosts


def local_image(ref: Any) -> Any:
    """A PIL image (as it is, in RGB), bytes, a data: / http(s) URL or a path -> a PIL image."""
    from PIL import Image

    if isinstance(ref, Image.Image):
        return ref if ref.mode == "RGB" else ref.convert("RGB")
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return load_image(bytes(ref), CALLER_POLICY)
    if isinstance(ref, str):
        return load_image(ref, CALLER_POLICY)
    raise ValueError(f"an image is a PIL image, bytes, a URL or a path, not "
                     f"{type(ref).__name__}")
