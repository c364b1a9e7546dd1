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

An agent re-sends the same screenshot every turn: the processor's output is kept by a hash of
the image's pixels (its mode, size and bytes; least recently used out, PROCESSED_CACHE_BYTES of
tensors), so a picture seen before costs a hash, not a resize.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from radixrt.runtime.image_messages import (
    MAX_IMAGE_TENSOR_BYTES,
    MAX_IMAGES_PER_REQUEST,
    ImageInput,
    ImageTensor,
    id_seed,
    placeholder_ids,
    tensors_digest,
)
from radixrt.runtime.models.vision.processors import placeholder_token

_TEXT_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
PROCESSED_CACHE_BYTES = 256 << 20  # processed images kept, by their pixels' hash


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
        # pixels' hash -> (expansion, tensors, their digest)
        self._processed: OrderedDict[str, tuple[list[int], list[ImageTensor], str]] = (
            OrderedDict())
        self._processed_bytes = 0
        self._lock = threading.Lock()  # requests are expanded on threads (TokenizerManager)
        self._secret = secrets.token_bytes(32)  # keys the placeholder ids (image_messages.py)
        self.image_token = str(processor.image_token)  # what the template writes, once an image
        self.image_token_id = int(processor.tokenizer.convert_tokens_to_ids(self.image_token))
        # the token of the runs the processor expands it into (Gemma 3's differs)
        self.placeholder_id = int(processor.tokenizer.convert_tokens_to_ids(
            placeholder_token(processor)))
        self._special_ids = set(processor.tokenizer.all_special_ids) | {
            i for i, t in processor.tokenizer.added_tokens_decoder.items() if t.special}

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
        processed = []  # (tensors, digest, placeholders) of each image
        previous, edges = 0, False
        for i, (mark, image) in enumerate(zip(marks, images, strict=True)):
            out += ids[previous:mark]
            expansion, tensors, digest = self._process(i, image)
            edges = edges or not (self._special(expansion[0]) and self._special(expansion[-1]))
            processed.append((tensors, digest, expansion.count(self.placeholder_id)))
            out += expansion
            previous = mark + 1
        out += ids[previous:]
        if edges:  # an expansion that begins or ends in text (Gemma 3's "\n\n") joins its
            out = self._retokenized(out)  # neighbours' text as the processor's whole prompt does
        where = iter([p for p, t in enumerate(out) if t == self.placeholder_id])
        inputs: list[ImageInput] = []
        for tensors, digest, count in processed:
            positions = [next(where) for _ in range(count)]
            seed = id_seed(self._secret, digest)
            for p, pid in zip(positions, placeholder_ids(seed, count), strict=True):
                out[p] = pid
            inputs.append(ImageInput(digest=digest, runs=runs_of(positions), tensors=tensors,
                                     id_seed=seed))
        if next(where, None) is not None:
            raise ValueError("the prompt holds the model's image placeholder token as text: "
                             "leave it out")
        return out, inputs

    def _special(self, token: int) -> bool:
        return token in self._special_ids

    def _retokenized(self, ids: list[int]) -> list[int]:
        """Each run of non-special tokens decoded and tokenized again as one text: pieces
        tokenized apart (the rendered prompt, an image's expansion) join as the processor,
        which tokenizes the whole expanded prompt, joins them (special tokens split the text
        in both)."""
        tok = self.processor.tokenizer
        out: list[int] = []
        run: list[int] = []
        for token in [*ids, None]:
            if token is not None and not self._special(token):
                run.append(token)
                continue
            if run:
                text = tok.decode(run, skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)
                out += tok.encode(text, add_special_tokens=False)
                run = []
            if token is not None:
                out.append(token)
        return out

    def _process(self, index: int, image: Any) -> tuple[list[int], list[ImageTensor], str]:
        """The image's expansion, tensors and their digest: kept, or from the processor now."""
        key = _pixels_key(image)
        with self._lock:
            hit = self._processed.get(key)
            if hit is not None:
                self._processed.move_to_end(key)
                return list(hit[0]), hit[1], hit[2]
        expansion, tensors = self._run_processor(index, image)
        digest = tensors_digest(tensors)
        size = sum(len(t.data) for t in tensors)
        with self._lock:
            if key not in self._processed:
                self._processed[key] = (expansion, tensors, digest)
                self._processed_bytes += size
            while self._processed_bytes > PROCESSED_CACHE_BYTES and len(self._processed) > 1:
                _, (_, old, _) = self._processed.popitem(last=False)
                self._processed_bytes -= sum(len(t.data) for t in old)
        return list(expansion), tensors, digest

    def _run_processor(self, index: int, image: Any) -> tuple[list[int], list[ImageTensor]]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = self.processor(text=self.image_token, images=[image],
                                     add_special_tokens=False, return_tensors="pt")
        except Exception as exc:  # noqa: BLE001 - a processor's error is the image's, a 400
            raise ValueError(f"image {index} could not be processed: {exc}") from None
        tensors = [_image_tensor(name, value) for name, value in sorted(out.items())
                   if name not in _TEXT_OUTPUTS and hasattr(value, "numpy")]
        size = sum(len(t.data) for t in tensors)
        if size > MAX_IMAGE_TENSOR_BYTES:
            raise ValueError(f"image {index} makes {size} bytes of processed tensors, more than "
                             f"{MAX_IMAGE_TENSOR_BYTES}: send a smaller image")
        return [int(t) for t in out["input_ids"][0]], tensors


def _image_tensor(name: str, value: Any) -> ImageTensor:
    """A processor's output tensor as it travels: masks as bool (Idefics3's pixel mask is
    int64 ones and zeros: 8x the bytes), other integers as int64, floats and pixel values as
    float32 (a processor told not to rescale gives uint8 pixels; transformers' models cast
    pixel values to their dtype)."""
    import torch

    if name.endswith("attention_mask"):
        value = value != 0
    elif value.dtype != torch.bool:
        value = value.to(torch.float32 if value.is_floating_point() or name == "pixel_values"
                         else torch.int64)
    return ImageTensor(name=name, dtype=str(value.dtype).removeprefix("torch."),
                       shape=list(value.shape), data=value.contiguous().numpy().tobytes())


def _pixels_key(image: Any) -> str:
    """sha256 of a PIL image's mode, size and pixel bytes."""
    h = hashlib.sha256(f"{image.mode}|{image.size[0]}x{image.size[1]}|".encode())
    h.update(image.tobytes())
    return h.hexdigest()
