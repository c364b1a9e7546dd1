"""Images in DSL programs (rx.image): the text that stands for one in a program's text, and the
prompt a request's text and image files make.

A program appends the model's image token where it adds an image, and sends the image files'
bytes with every call whose text holds them (DslRequest.images, in the order of their tokens).
Which text stands for an image is the model's chat template's business: LLaVA's templates write
"<image>\\n" for an image part, others the bare token, or the token between vision markers. So
the endpoint renders a user message with and without an image part before the same sentinel
text, once, and tells clients the difference (op info's chat["image_token"]): a program's text
with an image inside a role is then what the template makes of the same message. The files are
untrusted: the tokenizer manager decodes them under the server's media limits (its
MediaPolicy: size, pixels) off the event loop, and the model's processor expands each token.
"""

from __future__ import annotations

from typing import Any

from radixrt.runtime.constrained.structural import ToolFormat
from radixrt.runtime.image_messages import ImageInput
from radixrt.runtime.messages import DslRequest
from radixrt.runtime.tokenizer.chat_tool_prompts import dsl_chat_info
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

SENTINEL = "\u2063radixrt-image-probe\u2063"  # text no template writes by itself


def program_chat(manager: TokenizerManager, tool_format: ToolFormat) -> dict[str, Any]:
    """What DSL clients build a program's prompts from (op info's and /server_info's "chat"):
    the roles' markers and the tool prompt (dsl_chat_info) and, on a vision-language model, the
    text that stands for an image ("image_token": image_text)."""
    chat = dsl_chat_info(manager.tokenizer, tool_format)
    images = manager.front.images
    if images is not None:
        chat["image_token"] = image_text(manager.tokenizer, images.image_token)
    return chat


def image_text(tokenizer: Any, image_token: str) -> str:
    """What the chat template writes for one image part ({"type": "image"}) of a user message,
    e.g. "<image>\\n"; the bare image token where the template has none to say (no template, a
    template that takes no content parts, or one that writes no image token)."""
    if not getattr(tokenizer, "chat_template", None):
        return image_token
    try:
        plain = _before_sentinel(tokenizer, [{"type": "text", "text": SENTINEL}])
        with_image = _before_sentinel(tokenizer, [{"type": "image"},
                                                  {"type": "text", "text": SENTINEL}])
    except Exception:  # noqa: BLE001 - a template that refuses content parts: the bare token
        return image_token
    if plain is None or with_image is None or not with_image.startswith(plain):
        return image_token
    written = with_image[len(plain):]
    return written if written.count(image_token) == 1 else image_token


def _before_sentinel(tokenizer: Any, content: list[dict[str, str]]) -> str | None:
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=False)
    head, found, _ = str(text).partition(SENTINEL)
    return head if found else None


async def request_prompt(manager: TokenizerManager,
                         req: DslRequest) -> tuple[list[int], list[ImageInput]]:
    """A generate's prompt: token ids (with the images' placeholders) and its images.
    ValueError for a prompt without text or ids, images without text, a model that takes no
    images, or an image that cannot be used ("image i: why")."""
    if not req.images:
        prompt: Any = req.input_ids if req.input_ids is not None else req.text
        if prompt is None:
            raise ValueError("give `text` or `input_ids`")
        return manager.encode(prompt), []
    if req.text is None or req.input_ids is not None:
        raise ValueError("images go with `text` (one image token per image), not `input_ids`")
    pictures = await images_of(manager, req)
    return await manager.encode_images(req.text, pictures)


async def images_of(manager: TokenizerManager, req: DslRequest) -> list[Any]:
    """A request's image files, decoded (off the event loop, bounded); ValueError for a model
    that takes no images or an image that cannot be used ("image i: why")."""
    if not req.images:
        return []
    if not manager.takes_images:
        raise ValueError("this model takes no images: serve a vision-language model (rx.image "
                         "needs one)")
    return await manager.load_images(list(req.images))
