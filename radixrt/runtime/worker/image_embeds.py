"""The images' rows of a forward pass: which rows of the batch are image placeholders, and the
vision encoder's features that replace their embeddings.

A request's images come with it (WorkerRequest.images: each image's tensors, digest and
placeholder runs). For every batch entry (positions start .. start+length-1 of one request),
each image run that overlaps it gives the batch rows it covers and the features' rows that go
there -- so a chunk of a prefill that cuts an image takes exactly its part of the features,
and a prefix the radix cache matched needs none of them. The worker's token lists hold the
image token where the prompt holds placeholders (`shown`); the rows' ids are set to 0 for the
embedding lookup (an image token may lie past the embedding; the decoder overwrites the rows).

Features are cached by digest (least recently used first out, bounded in bytes): a screenshot
sent again in the next turn, or a request re-admitted after preemption, is not encoded again.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from radixrt.runtime.forward.forward_batch import ForwardBatch
from radixrt.runtime.image_messages import ImageInput, ImageTensor, is_image_id
from radixrt.runtime.models.vision.encoder import VisionEncoder
from radixrt.runtime.models.vision.processors import placeholder_token
from radixrt.runtime.worker.image_positions import mrope_positions

DEFAULT_FEATURE_CACHE_BYTES = 512 << 20  # the encoder's outputs kept, by image digest
MAX_GRIDS = 4096  # images' merged grids kept (multimodal RoPE), by digest
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}

# one batch entry: the request's images, its first new position, its number of new tokens
ImageEntry = tuple[Sequence[ImageInput], int, int]


def image_token_id(tokenizer: Any, processor: Any) -> int:
    """The id of the token an image's placeholders stand for in transformers' input_ids."""
    return int(tokenizer.convert_tokens_to_ids(placeholder_token(processor)))


def image_tensor(t: ImageTensor, device: torch.device) -> Tensor:
    """An ImageTensor's tensor (a copy: the message's bytes stay read-only)."""
    if t.dtype not in _DTYPES:
        raise ValueError(f"image tensor {t.name!r} has dtype {t.dtype!r}")
    flat = torch.frombuffer(bytearray(t.data), dtype=_DTYPES[t.dtype])
    return flat.reshape(t.shape).to(device)


class ImageEmbedder:
    def __init__(self, encoder: VisionEncoder, device: torch.device, dtype: torch.dtype,
                 image_token: int, cache_bytes: int = DEFAULT_FEATURE_CACHE_BYTES,
                 mrope: bool = False) -> None:
        """image_token: the model's image token id (what the worker's token lists hold for a
        placeholder: `shown`); mrope: the decoder takes multimodal RoPE's 3-D positions
        (image_positions.py)."""
        self.encoder = encoder
        self.image_token = image_token
        self.mrope = mrope
        self._grids: dict[str, tuple[int, int, int]] = {}  # digest -> merged grid
        self.device = device
        self.dtype = dtype
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, Tensor] = OrderedDict()  # digest -> [features, hidden]
        self._cached_bytes = 0
        self.encoded = 0  # images run through the encoder
        self.hits = 0  # images whose features came from the cache
        self.encode_seconds = 0.0

    def shown(self, prompt_ids: Sequence[int]) -> list[int]:
        """A prompt's ids with each placeholder as the image token, as transformers' input_ids
        hold them: what the penalties read (a repetition penalty counts the image token) and
        what the embedding looks up before the features replace those rows."""
        return [self.image_token if is_image_id(t) else t for t in prompt_ids]

    def features(self, image: ImageInput) -> Tensor:
        """[num_features, hidden] of one image: cached, or encoded now."""
        hit = self._cache.get(image.digest)
        if hit is not None:
            self._cache.move_to_end(image.digest)
            self.hits += 1
            return hit
        start = time.perf_counter()
        tensors = {}
        for t in image.tensors:
            value = image_tensor(t, self.device)
            tensors[t.name] = value.to(self.dtype) if value.is_floating_point() else value
        with torch.no_grad():
            feats = self.encoder.encode(tensors)  # [num_features, hidden]
        if feats.shape[0] != image.num_features:
            raise RuntimeError(f"the vision encoder made {feats.shape[0]} rows of an image with "
                               f"{image.num_features} placeholders")
        self.encode_seconds += time.perf_counter() - start
        self.encoded += 1
        self._cache[image.digest] = feats
        self._cached_bytes += feats.numel() * feats.element_size()
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= old.numel() * old.element_size()
        return feats

    def place(self, batch: ForwardBatch, entries: Sequence[ImageEntry]) -> None:
        """Set batch.image_rows / image_embeds for the entries' image positions (entries in
        batch order, one per entry) and 0 as their ids; and multimodal RoPE's positions."""
        if self.mrope:
            batch.mrope_positions = mrope_positions(entries, self.grid, batch.input_ids.device)
        rows: list[Tensor] = []
        embeds: list[Tensor] = []
        lasts: list[Tensor] = []  # each image row's run's last position (bidirectional)
        offset = 0
        for images, start, length in entries:
            end = start + length
            for image in images:
                feature, feats = 0, None
                for run_start, run_len in image.runs:
                    lo, hi = max(start, run_start), min(end, run_start + run_len)
                    if lo < hi:
                        feats = self.features(image) if feats is None else feats
                        first = feature + lo - run_start
                        embeds.append(feats[first : first + hi - lo])
                        rows.append(torch.arange(offset + lo - start, offset + hi - start))
                        lasts.append(torch.full((hi - lo,), run_start + run_len - 1))
                    feature += run_len
            offset += length
        if not rows:
            return
        index = torch.cat(rows).to(batch.input_ids.device)
        batch.input_ids[index] = 0
        batch.image_rows = index
        batch.image_embeds = torch.cat(embeds)  # [len(index), hidden]
        if self.encoder.bidirectional:  # an image's rows see its whole run (a chunk holds it)
            limits = batch.positions.clone()
            limits[index] = torch.cat(lasts).to(limits.device)
            batch.key_limits = limits

    def grid(self, image: ImageInput) -> tuple[int, int, int]:
        """The image's merged grid (multimodal RoPE's positions of its rows)."""
        grid = self._grids.get(image.digest)
        if grid is None:
            tensors = {t.name: image_tensor(t, torch.device("cpu")) for t in image.tensors}
            grid = self._grids[image.digest] = self.encoder.position_grid(tensors)
            if len(self._grids) > MAX_GRIDS:
                self._grids.pop(next(iter(self._grids)))
        return grid

    def counts(self) -> tuple[int, int, float]:
        """Images encoded, images the cache had, the encoder's seconds: so far."""
        return self.encoded, self.hits, self.encode_seconds

    def since(self, before: tuple[int, int, float]) -> dict[str, Any]:
        """StepResult's image fields for what happened after `counts()` was `before` ({}:
        nothing)."""
        encoded, hits, seconds = self.counts()
        if (encoded, hits) == before[:2]:
            return {}
        return {"images_encoded": encoded - before[0], "image_cache_hits": hits - before[1],
                "image_encode_seconds": seconds - before[2]}
