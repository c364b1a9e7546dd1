"""Images' placeholder ids and the scheduler's check of them: the same tensors under the same
secret give the same ids, different tensors or another secret different ids, every id above
every vocabulary and below the tokenizers' cap; a prompt whose placeholders do not match its
images is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixrt.runtime.image_messages import (
    IMAGE_ID_BASE,
    MAX_IMAGES_PER_REQUEST,
    ImageInput,
    ImageTensor,
    check_image_prompt,
    id_seed,
    is_image_id,
    placeholder_ids,
    tensors_digest,
)
from radixrt.runtime.tokenizer.prompts import MAX_TOKEN_ID

SECRET = b"s" * 32


def image(pixels: bytes, runs: list[list[int]], secret: bytes = SECRET) -> ImageInput:
    tensors = [ImageTensor(name="pixel_values", dtype="float32", shape=[len(pixels) // 4],
                           data=pixels)]
    digest = tensors_digest(tensors)
    return ImageInput(digest=digest, runs=runs, tensors=tensors, id_seed=id_seed(secret, digest))


@given(st.binary(min_size=4, max_size=64).filter(lambda b: len(b) % 4 == 0),
       st.integers(1, 2000))
def test_placeholder_ids_are_images_and_valid_token_ids(pixels: bytes, count: int) -> None:
    ids = placeholder_ids(image(pixels, [[0, 1]]).id_seed, count)
    assert len(ids) == count
    assert all(is_image_id(t) and IMAGE_ID_BASE <= t < MAX_TOKEN_ID for t in ids)


def test_same_tensors_same_ids_other_tensors_or_secret_other_ids() -> None:
    a, b = image(b"\x00" * 16, [[0, 4]]), image(b"\x00" * 16, [[0, 4]])
    c = image(b"\x00" * 12 + b"\x01\x00\x00\x00", [[0, 4]])
    d = image(b"\x00" * 16, [[0, 4]], secret=b"t" * 32)
    assert placeholder_ids(a.id_seed, 4) == placeholder_ids(b.id_seed, 4)
    assert placeholder_ids(a.id_seed, 4)[0] != placeholder_ids(c.id_seed, 4)[0]
    assert placeholder_ids(a.id_seed, 4)[0] != placeholder_ids(d.id_seed, 4)[0]
    shape = ImageTensor(name="pixel_values", dtype="float32", shape=[2, 2], data=b"\x00" * 16)
    assert tensors_digest([shape]) != a.digest, "the shape is part of the digest"


def prompt_with(im: ImageInput, text: list[int], at: int) -> list[int]:
    ids = placeholder_ids(im.id_seed, im.num_features)
    return text[:at] + ids + text[at:]


def test_a_well_placed_image_passes_and_misplaced_ones_are_refused() -> None:
    text = [5, 6, 7, 8]
    good = image(b"\x01" * 8, [[2, 3]])
    prompt = prompt_with(good, text, 2)
    check_image_prompt(prompt, [good])
    with pytest.raises(ValueError, match="does not hold its placeholder id"):
        check_image_prompt(prompt, [image(b"\x01" * 8, [[1, 3]])])
    with pytest.raises(ValueError, match="outside the prompt"):
        check_image_prompt(prompt, [image(b"\x01" * 8, [[7, 3]])])
    with pytest.raises(ValueError, match="of no image"):
        check_image_prompt(prompt, [])
    with pytest.raises(ValueError, match="runs must be"):
        check_image_prompt(text, [image(b"\x01" * 8, [[0, 0]])])
    with pytest.raises(ValueError, match="at most"):
        check_image_prompt(prompt, [good] * (MAX_IMAGES_PER_REQUEST + 1))
