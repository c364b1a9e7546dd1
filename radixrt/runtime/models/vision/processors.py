"""A vision-language checkpoint's processor: transformers' own (AutoProcessor), or -- where
transformers cannot build that class here -- its image processor and tokenizer joined by the
processor class's own image-token expansion.

transformers builds Qwen2-VL's processor with a video processor, and video processors need
torchvision; without it, AutoProcessor fails although images need nothing of it. Then
`ImageTokenProcessor` does what the processor does for a prompt with images: the checkpoint's
image processor (transformers', from preprocessor_config.json: the same resizing and
normalising), each image token replaced by the processor class's own `replace_image_token`
(called on this object, which carries the attributes it reads), the text tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# model_type -> its processor class, where a checkpoint may need ImageTokenProcessor
PROCESSOR_CLASSES = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}


class ImageTokenProcessor:
    def __init__(self, processor_class: Any, image_processor: Any, tokenizer: Any,
                 image_token: str) -> None:
        self.processor_class = processor_class
        self.image_processor = image_processor
        self.tokenizer = tokenizer
        self.image_token = image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.chat_template = getattr(tokenizer, "chat_template", None)

    def __call__(self, text: str, images: Sequence[Any] | None = None,
                 add_special_tokens: bool = False, return_tensors: str | None = None
                 ) -> dict[str, Any]:
        pieces = text.split(self.image_token)
        images = list(images or [])
        if len(pieces) - 1 != len(images):
            raise ValueError(f"{len(pieces) - 1} image tokens for {len(images)} images")
        inputs = dict(self.image_processor(images=images, return_tensors="pt")) if images else {}
        expanded = pieces[0]
        for i, piece in enumerate(pieces[1:]):
            expanded += self.processor_class.replace_image_token(self, inputs, i) + piece
        encoded = self.tokenizer(expanded, add_special_tokens=add_special_tokens,
                                 return_tensors=return_tensors)
        return {**encoded, **inputs}

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("tokenize", False)
        return self.tokenizer.apply_chat_template(messages, **kwargs)


def placeholder_token(processor: Any) -> str:
    """The token whose runs stand for an image's features: the processor's image token (what
    the chat template writes), or the tokenizer's own image token where the processor expands
    a marker into another (Gemma 3: <start_of_image> into <image_soft_token> runs)."""
    return str(getattr(processor.tokenizer, "image_token", None) or processor.image_token)


def load_processor(folder: str, model_type: str, image_token: str | None) -> Any:
    """AutoProcessor of the folder, else (a class transformers cannot build here, see above)
    an ImageTokenProcessor."""
    import transformers

    try:
        return transformers.AutoProcessor.from_pretrained(folder)
    except (AttributeError, ImportError, ValueError, TypeError, OSError):
        name = PROCESSOR_CLASSES.get(model_type)
        if name is None or image_token is None:
            raise
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    image_processor = transformers.AutoImageProcessor.from_pretrained(folder)
    return ImageTokenProcessor(getattr(transformers, name), image_processor, tokenizer,
                               getattr(tokenizer, "image_token", None) or image_token)
