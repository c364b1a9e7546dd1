"""HttpRuntimeEndpoint: DSL programs on a radixrt server over its HTTP port, what
`RuntimeEndpoint("http://host:port")` gives (SGLang's RuntimeEndpoint takes an HTTP URL too).

gen and select run as on any OpenAI-compatible server (OpenAICompatible: /v1/completions, the
choices scored in one echo request), with the role markers from /server_info; what the radixrt
server adds is used: a fork's prefix is pinned with POST /generate {"pin": true} under the same
lease as over ZeroMQ (renewed in the background with /renew_pins, released with /unpin), and
flush_cache / get_server_info reach /flush_cache and /server_info. A call whose text holds
images (rx.image, on a vision-language model: /server_info names the text that stands for one)
goes through the native /generate with the images (http_images.py). The ZeroMQ endpoint
(`--dsl-port`, tcp://) is the faster path: one call per select, no HTTP parsing.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import httpx

from radixrt.frontend.backends.http_client import error_message
from radixrt.frontend.backends.http_images import NativeImageCalls
from radixrt.frontend.backends.lease_keeper import LeaseKeeper
from radixrt.frontend.backends.openai_backend import OpenAICompatible
from radixrt.frontend.lang.backend import (
    PREFILL_ONLY,
    BackendError,
    ChoiceLogprobs,
    GenResult,
    PieceCallback,
)
from radixrt.runtime.config import PIN_LEASE_TTL_S, PIN_RENEWALS_PER_TTL


class HttpRuntimeEndpoint(OpenAICompatible):
    no_images = ("rx.image needs a vision-language model: this server's model takes no images "
                 "(its /server_info names no image text)")
    sends_images = True

    def __init__(self, url: str, api_key: str | None = None) -> None:
        root = url.rstrip("/").removesuffix("/v1")
        self.root = root
        try:
            response = httpx.get(f"{root}/server_info", timeout=30,
                                 headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        except httpx.HTTPError as exc:
            raise BackendError(f"no radixrt server answered at {root} ({exc}); start one with "
                               "`radixrt serve`") from None
        if response.status_code != 200:
            raise BackendError(f"{root}/server_info: {error_message(response)} (is it a radixrt "
                               "server? other servers: rx.OpenAICompatible)")
        info = response.json()
        super().__init__(f"{root}/v1", info.get("model", "default"), api_key)
        self._cache_on = not info.get("disable_radix_cache", False)
        self.model_path: str | None = info.get("model_path")  # its local tokenizer folder
        ttl = float(info.get("pin_lease_ttl_s", PIN_LEASE_TTL_S))
        self._leases = LeaseKeeper(self._renew, ttl / PIN_RENEWALS_PER_TTL)
        self._images = NativeImageCalls(self._http, root)

    def generate(self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                 priority: int = 0, images: Sequence[bytes] = ()) -> GenResult:
        if not images:
            return super().generate(text, params, on_piece, priority)
        result = self._images.generate(text, params, on_piece, priority, images)
        self.token_usage.add(result.prompt_tokens, result.completion_tokens,
                             result.cached_tokens)
        return result

    def score(self, text: str, choices: list[str], unconditional: bool, priority: int = 0,
              images: Sequence[bytes] = ()) -> list[ChoiceLogprobs]:
        if not images:
            return super().score(text, choices, unconditional, priority)
        scores = self._images.score(text, choices, priority, images)
        if unconditional:  # each choice alone, as the text-only path scores it
            alone = self._echo_scores([(self._score_start(), c) for c in choices], priority)
            if alone is None:
                raise BackendError("the server returned no prompt log-probabilities")
            scores = [ChoiceLogprobs(s.logprobs, a) for s, a in zip(scores, alone)]
        return scores

    def pin(self, text: str, priority: int = 0, images: Sequence[bytes] = ()) -> int | None:
        if not self._cache_on:
            return None
        if images:
            meta = self._images.pin(text, priority, images)
        else:
            meta = self._native("/generate", {"text": text, "pin": True, "priority": priority,
                                              "sampling_params": PREFILL_ONLY})["meta_info"]
        self.token_usage.add(meta.get("prompt_tokens", 0), 0, meta.get("cached_tokens", 0))
        if meta.get("pin_id") is None:
            warnings.warn(f"radixrt: {meta.get('pin_error')}", RuntimeWarning, stacklevel=2)
            return None
        self._leases.hold(int(meta["pin_id"]))
        return int(meta["pin_id"])

    def unpin(self, handle: Any) -> None:
        self._leases.drop(int(handle))
        self._native("/unpin", {"pin_id": int(handle)})

    def get_model_name(self) -> str:
        """SGLang's name: the server's local tokenizer folder where it says it, else the model
        name it serves."""
        return self.model_path or self.model

    def flush_cache(self) -> int:
        return int(self._native("/flush_cache", {}).get("freed_tokens", 0))

    def close(self) -> None:
        self._leases.stop()
        super().close()

    def _renew(self, pin_ids: list[int]) -> None:
        self._native("/renew_pins", {"pin_ids": pin_ids})

    def _native(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._http.request("POST", self.root + path, json=body)
        except httpx.HTTPError as exc:
            raise BackendError(f"{self.root} did not answer: {exc}") from None
        if response.status_code != 200:
            raise BackendError(error_message(response))
        return response.json()
