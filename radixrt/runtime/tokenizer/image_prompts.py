"""A prompt's images: where each stands in the token ids, and what the worker needs of it.

The prompt is rendered and tokenized as text first: the chat template (or the user's text)
writes the model's image token once per image (LLaVA's `<image>`, Idefics3's `<image>`,
Qwen2-VL's `<|image_pad|>` between its vision markers). Then, image by image:

1. the model's own processor runs on that image alone with the image token as its text, which
   gives the image's expansion (its run(s) of image tokens, and whatever text the family wraps
   them in: Idefics3's tile rows and columns) and its tensors (pixel values, sizes, grids);
2. the single image token is replaced by the expansion, each image token of it by the image's
   placeholder id for that feature row (image_messages.placeholder_ids: derived from the
   digest of the tensors), so the radix tree tells images apart and shares repeated ones.

The processors' expansions begin and end on special tokens, so splicing them into the rendered
ids gives what the processor gives for the whole prompt (the tests hold it to that).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from radixrt.runtime.image_messages import (
    MAX_IMAGES_PER_REQUEST,
    ImageInput,
    ImageTensor,
    placeholder_ids,
    tensors_digest,
)

_TEXT_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


def runs_of(positions: Sequence[int]) -> list[list[int]]:
    """Consecutive positions as [start, length] runs, in order."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1][1] += 1
        else:
            runs.append([p, 1])
    return runs


class ImagePrompts:
    """A vision-language model's processor, applied to a prompt's images."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.image_token = str(processor.image_token)
        self.image_token_id = int(processor.tokenizer.convert_tokens_to_ids(self.image_token))

    def expand(self, ids: Sequence[int], images: Sequence[Any]) -> tuple[list[int],
                                                                         list[ImageInput]]:
        """Token ids with one image token per image (in order) -> the ids with each image's
        placeholders, and the images as the worker takes them. ValueError when the counts
        differ or an image cannot be processed."""
        marks = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(marks) != len(images):
            raise ValueError(f"the prompt has {len(marks)} image tokens "
                             f"({self.image_token!r}) but {len(images)} images were given: "
                             "give one image per image token")
        if len(images) > MAX_IMAGES_PER_REQUEST:
            raise ValueError(f"{len(images)} images in one request: at most "
                             f"{MAX_IMAGES_PER_REQUEST}")
        out: list[int] = []
        inputs: list[ImageInput] = []
        previous = 0
        for i, (mark, image) in enumerate(zip(marks, images, strict=True)):
            out += ids[previous:mark]
            expansion, tensors = self._process(i, image)
            digest = tensors_digest(tensors)
            rows = [j for j, t in enumerate(expansion) if t == self.image_token_id]
            for j, pid in zip(rows, placeholder_ids(digest, len(rows)), strict=True):
                expansion[j] = pid
            inputs.append(ImageInput(digest=digest, runs=runs_of([len(out) + j for j in rows]),
                                     tensors=tensors))
            out += expansion
            previous = mark + 1
        return out + list(ids[previous:]), inputs

    def _process(self, index: int, image: Any) -> tuple[list[int], list[ImageTensor]]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = self.processor(text=self.image_token, images=[image],
                                     add_special_tokens=False, return_tensors="pt")
        except (ValueError, TypeError, OSError) as exc:
            raise ValueError(f"image {index} could not be processed: {exc}") from None
        tensors = [ImageTensor(name=name, dtype=str(value.dtype).removeprefix("torch."),
                               shape=list(value.shape),
                               data=value.contiguous().numpy().tobytes())
                   for name, value in sorted(out.items())
                   if name not in _TEXT_OUTPUTS and hasattr(value, "numpy")]
        return [int(t) for t in out["input_ids"][0]], tensors
