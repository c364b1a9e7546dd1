"""Images in a prompt, as they cross the process boundaries (messages.py carries them), and the
token ids that stand for them in the radix tree.

The tokenizer process runs the model's own image processor on each image (tokenizer/
image_prompts.py): its tensors (pixel values, sizes, grids) travel as `ImageTensor`s, with
their sha256 `digest` (the key of the worker's cache of the tower's output). The image's
run(s) of placeholder tokens in the prompt get ids drawn from its `id_seed` -- an HMAC of the
digest under a secret of the process that made it -- each feature row k independently:
IMAGE_ID_BASE + blake2b(k, key=id_seed) mod IMAGE_ID_SPAN (`placeholder_ids`). So two prompts
with the same image share a prefix in the radix tree; two different images share none of
it but by a 2^-31 chance per placeholder (never by design: nobody without the secret can
search for an image whose ids collide with another's); and no placeholder id is a vocabulary
id (every vocabulary is far smaller than IMAGE_ID_BASE). The worker replaces a placeholder's
embedding by row k of its image's features (worker/image_embeds.py); nothing else treats the
ids specially but the scheduler's checks (every id outside an image's runs is a vocabulary id,
every id inside is its image's) and the drafts (never an image id: speculator.py).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Iterator, Sequence

import msgspec

IMAGE_ID_BASE = 1 << 31  # placeholder ids start here (above every vocabulary)
IMAGE_ID_SPAN = 1 << 31  # and stay below IMAGE_ID_BASE + IMAGE_ID_SPAN = 2**32 (tokenizers' cap)
MAX_IMAGES_PER_REQUEST = 16  # a request's images (its placeholder runs bound the rest)
# one image's processed tensors, all together (Qwen2-VL's largest, 12.8 megapixels, are 88 MB
# of float32 patches)
MAX_IMAGE_TENSOR_BYTES = 128 << 20
IMAGE_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")
_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1}


class ImageTensor(msgspec.Struct, frozen=True):
    """One tensor the image processor made of an image (pixel_values, image_sizes, ...),
    row-major bytes of `dtype` (one of IMAGE_DTYPES) in `shape`."""

    name: str
    dtype: str
    shape: list[int]
    data: bytes


class ImageInput(msgspec.Struct, frozen=True):
    """An image of a prompt: its processed tensors, their digest, and the prompt positions its
    features go to, as runs [start, length] in feature order (the features' row k goes to the
    k-th position the runs cover)."""

    digest: str  # sha256 hex of its tensors (names, dtypes, shapes, bytes)
    runs: list[list[int]]
    tensors: list[ImageTensor]
    id_seed: str = ""  # hex; its placeholders' ids (placeholder_ids): keyed by its maker

    @property
    def num_features(self) -> int:
        return sum(length for _, length in self.runs)

    def positions(self) -> Iterator[tuple[int, int]]:
        """(prompt position, feature row) of every placeholder, in order."""
        row = 0
        for start, length in self.runs:
            for i in range(length):
                yield start + i, row + i
            row += length


def images_bytes(images: Sequence[ImageInput]) -> int:
    """The bytes of the images' processed tensors."""
    return sum(len(t.data) for image in images for t in image.tensors)


def tensors_digest(tensors: Sequence[ImageTensor]) -> str:
    """sha256 of the tensors' names, dtypes, shapes and bytes, in order."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(f"{t.name}|{t.dtype}|{','.join(map(str, t.shape))}|{len(t.data)}|".encode())
        h.update(t.data)
    return h.hexdigest()


def id_seed(secret: bytes, digest: str) -> str:
    """An image's id seed: HMAC-SHA256 of its digest under the maker's secret."""
    return hmac.new(secret, digest.encode(), hashlib.sha256).hexdigest()


def placeholder_ids(seed: str, count: int) -> list[int]:
    """The ids of an image's `count` placeholder tokens (its features' rows 0..count-1), each
    drawn independently from the seed."""
    key = bytes.fromhex(seed) if seed else b"\x00"
    return [IMAGE_ID_BASE + int.from_bytes(hashlib.blake2b(
        k.to_bytes(4, "little"), key=key, digest_size=8).digest(), "little") % IMAGE_ID_SPAN
        for k in range(count)]


def is_image_id(token: int) -> bool:
    return token >= IMAGE_ID_BASE


def check_image_prompt(prompt_ids: Sequence[int], images: Sequence[ImageInput]) -> None:
    """Raise ValueError unless every image's runs lie in the prompt, do not overlap, hold
    exactly its placeholder ids, and no placeholder id stands anywhere else."""
    if len(images) > MAX_IMAGES_PER_REQUEST:
        raise ValueError(f"{len(images)} images in one request: at most "
                         f"{MAX_IMAGES_PER_REQUEST}")
    covered: set[int] = set()
    for i, image in enumerate(images):
        for t in image.tensors:
            if t.dtype not in IMAGE_DTYPES or math.prod(t.shape) * _ITEM_BYTES[t.dtype] != len(
                    t.data) or any(n < 0 for n in t.shape):
                raise ValueError(f"image {i}: tensor {t.name!r} is not {t.shape} of {t.dtype}")
        size = sum(len(t.data) for t in image.tensors)
        if size > MAX_IMAGE_TENSOR_BYTES:
            raise ValueError(f"image {i}: {size} bytes of processed tensors, at most "
                             f"{MAX_IMAGE_TENSOR_BYTES}")
        if any(len(run) != 2 or run[1] < 1 or run[0] < 0 for run in image.runs) or not image.runs:
            raise ValueError(f"image {i}: its runs must be [start, length >= 1] pairs")
        ids = placeholder_ids(image.id_seed, image.num_features)
        for (position, row) in image.positions():
            if position >= len(prompt_ids) or position in covered:
                raise ValueError(f"image {i}: position {position} is outside the prompt or "
                                 "another image's")
            if prompt_ids[position] != ids[row]:
                raise ValueError(f"image {i}: position {position} does not hold its "
                                 "placeholder id")
            covered.add(position)
    stray = [p for p, t in enumerate(prompt_ids) if is_image_id(t) and p not in covered]
    if stray:
        raise ValueError(f"prompt positions {stray[:5]} hold image placeholder ids of no image")
