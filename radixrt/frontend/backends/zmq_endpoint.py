"""ZmqRuntimeEndpoint: run DSL programs on a radixrt runtime over ZeroMQ (`radixrt serve`).

The frontend sends text; the runtime tokenizes it and its radix tree finds what earlier calls
already computed. `select` is one call (all choices scored in one batch), and a fork's prefix is
computed once and pinned in the radix cache until the fork is joined. Streamed pieces carry their
tokens and logprob entries (PieceMeta); `token_usage` counts what every generate sent and got;
`token_texts` asks the runtime for token ids' texts (its op token_texts). A program's images
(rx.image) go with its generate, score and pin calls as the files' bytes (DslRequest.images); the
runtime names its image token in op info's chat.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from radixrt.frontend.backends.lease_keeper import LeaseKeeper
from radixrt.frontend.backends.zmq_client import DslClient
from radixrt.frontend.lang.backend import (
    PREFILL_ONLY,
    SEPARATE_REASONING,
    BackendError,
    ChatFormat,
    ChoiceLogprobs,
    GenResult,
    PieceCallback,
    PieceMeta,
    TokenUsage,
)
from radixrt.frontend.lang.sglang_names import LORA
from radixrt.runtime.config import DSL_CONNECT_TIMEOUT_S, PIN_LEASE_TTL_S, PIN_RENEWALS_PER_TTL
from radixrt.runtime.messages import TokenLogprob
from radixrt.runtime.sampling_params import SamplingParams


def logprob_meta(output: list[TokenLogprob], prompt: list[TokenLogprob]) -> dict[str, Any]:
    """Token logprobs in SGLang's meta info shape: (logprob, token id, None) entries."""
    meta: dict[str, Any] = {}
    for kind, lps in (("output", output), ("input", prompt)):
        if lps:
            meta[f"{kind}_token_logprobs"] = [(lp.logprob, lp.token_id, None) for lp in lps]
            meta[f"{kind}_top_logprobs"] = [[(lp_, tid, None) for tid, lp_ in lp.top]
                                            for lp in lps]
    return meta


class ZmqRuntimeEndpoint:
    """One radixrt runtime over ZeroMQ: `radixrt serve --dsl-port PORT` at "tcp://127.0.0.1:PORT",
    or the ipc:// address its log names; `api_key`: the server's `--api-key`, if it has one.
    Users write `rx.RuntimeEndpoint(address)` (runtime_endpoint.py), which is this class for a
    tcp:// or ipc:// address."""

    def __init__(self, address: str, connect_timeout: float = DSL_CONNECT_TIMEOUT_S,
                 alive: Callable[[], bool] | None = None, api_key: str | None = None) -> None:
        if not address.startswith(("tcp://", "ipc://")):
            raise ValueError(f"address {address!r} must be tcp://HOST:PORT, ipc://PATH or "
                             "http://HOST:PORT")
        self.address = address
        self._client = DslClient(address, alive, api_key)
        try:
            reply = self._client.call(op="info", timeout=connect_timeout)
        except BackendError as exc:
            self._client.close()
            raise BackendError(
                f"no radixrt runtime answered at {address} ({exc}); start one with "
                "`radixrt serve --dsl-port PORT`"
            ) from None
        self._chat = ChatFormat.from_info(reply.info.get("chat", {}))
        self._cache_on = not reply.info.get("disable_radix_cache", False)
        self.model = reply.info.get("model")
        self._model_path: str | None = reply.info.get("model_path")
        self.token_usage = TokenUsage()
        ttl = float(reply.info.get("pin_lease_ttl_s", PIN_LEASE_TTL_S))
        self._leases = LeaseKeeper(lambda ids: self._client.call(op="renew", pin_ids=ids),
                                   ttl / PIN_RENEWALS_PER_TTL)

    # --- Backend ------------------------------------------------------------------------------
    def chat_format(self) -> ChatFormat:
        return self._chat

    @property
    def model_path(self) -> str | None:
        """The local folder the runtime loaded its tokenizer from, where it says (None: it does
        not)."""
        return self._model_path

    def get_model_name(self) -> str:
        """SGLang's name: the model's path (the runtime's tokenizer folder, which a Hugging Face
        tokenizer loads from) where the runtime says it, else the name it serves the model as."""
        return self.model_path or str(self.model)

    def token_texts(self, token_ids: list[int]) -> list[str]:
        """Each token id's text, decoded on its own by the runtime's tokenizer."""
        if not token_ids:
            return []
        reply = self._client.call(op="token_texts", input_ids=[int(t) for t in token_ids])
        return list(reply.info["texts"])

    # each call is built once and read once; `call` runs it blocking, `acall` on asyncio (the
    # async twins are what arun's programs use: runners.LoopRunner)
    def generate(self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                 priority: int = 0, images: Sequence[bytes] = ()) -> GenResult:
        forward, fields = self._generate_call(text, params, on_piece, priority, images)
        return self._counted(self._gen_result(self._client.call(forward, **fields)))

    async def agenerate(self, text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                        priority: int = 0, images: Sequence[bytes] = ()) -> GenResult:
        forward, fields = self._generate_call(text, params, on_piece, priority, images)
        return self._counted(self._gen_result(await self._client.acall(forward, **fields)))

    def score(self, text: str, choices: list[str], unconditional: bool,
              priority: int = 0, images: Sequence[bytes] = ()) -> list[ChoiceLogprobs]:
        return self._scores(self._client.call(op="score", text=text, choices=choices,
                                              unconditional=unconditional, priority=priority,
                                              images=list(images)))

    async def ascore(self, text: str, choices: list[str], unconditional: bool,
                     priority: int = 0, images: Sequence[bytes] = ()) -> list[ChoiceLogprobs]:
        return self._scores(await self._client.acall(
            op="score", text=text, choices=choices, unconditional=unconditional,
            priority=priority, images=list(images)))

    def embed(self, text: str, dimensions: int | None, priority: int = 0) -> list[float]:
        return self._embedded(self._client.call(op="embed", text=text, dimensions=dimensions,
                                                priority=priority))

    async def aembed(self, text: str, dimensions: int | None,
                     priority: int = 0) -> list[float]:
        return self._embedded(await self._client.acall(op="embed", text=text,
                                                       dimensions=dimensions,
                                                       priority=priority))

    def _embedded(self, reply: Any) -> list[float]:
        if not reply.embedding:
            raise BackendError(f"embed ended without a vector ({reply.finish_reason})")
        self.token_usage.add(reply.prompt_tokens, 0, reply.cached_tokens)  # a prefill
        return list(reply.embedding)

    def pin(self, text: str, priority: int = 0, images: Sequence[bytes] = ()) -> int | None:
        if not self._cache_on:  # nothing to keep: computing the prefix first would be waste
            return None
        return self._pinned(self._client.call(**self._pin_call(text, priority, images)))

    async def apin(self, text: str, priority: int = 0,
                   images: Sequence[bytes] = ()) -> int | None:
        if not self._cache_on:
            return None
        return self._pinned(await self._client.acall(**self._pin_call(text, priority, images)))

    def unpin(self, handle: Any) -> None:
        self._leases.drop(int(handle))
        self._client.call(op="unpin", pin_id=int(handle))

    async def aunpin(self, handle: Any) -> None:
        self._leases.drop(int(handle))
        await self._client.acall(op="unpin", pin_id=int(handle))

    @staticmethod
    def _generate_call(text: str, params: dict[str, Any], on_piece: PieceCallback | None,
                       priority: int, images: Sequence[bytes] = ()
                       ) -> tuple[Callable[[Any], None] | None, dict[str, Any]]:
        # the params go typed (a bad field is a ValueError here, before anything is sent), a
        # constraint among them: the runtime compiles it (a broken pattern is refused);
        # separate_reasoning is the request's own field
        fields = dict(params)
        separate = bool(fields.pop(SEPARATE_REASONING, False))
        lora = fields.pop(LORA, None)
        forward = None if on_piece is None else (lambda reply: on_piece(reply.text, PieceMeta(
            len(reply.token_ids), logprob_meta(reply.logprobs, []))))
        return forward, dict(op="generate", text=text,
                             params=SamplingParams.from_fields(fields),
                             stream=on_piece is not None, priority=priority,
                             separate_reasoning=separate, lora=lora, images=list(images))

    @staticmethod
    def _gen_result(reply: Any) -> GenResult:
        sample = reply.samples[0] if reply.samples else None
        return GenResult(reply.text, reply.finish_reason, reply.prompt_tokens,
                         reply.cached_tokens, len(reply.token_ids),
                         logprob_meta(reply.logprobs, reply.prompt_logprobs),
                         [(c.name, c.arguments) for c in sample.tool_calls] if sample else [],
                         sample.reasoning if sample else None,
                         sample.content if sample else None)

    def _counted(self, result: GenResult) -> GenResult:
        self.token_usage.add(result.prompt_tokens, result.completion_tokens,
                             result.cached_tokens)
        return result

    @staticmethod
    def _scores(reply: Any) -> list[ChoiceLogprobs]:
        return [ChoiceLogprobs(list(c.logprobs), list(c.unconditional_logprobs))
                for c in reply.choices]

    @staticmethod
    def _pin_call(text: str, priority: int, images: Sequence[bytes] = ()) -> dict[str, Any]:
        return dict(op="generate", text=text, params=SamplingParams.from_fields(PREFILL_ONLY),
                    pin=True, priority=priority, images=list(images))

    def _pinned(self, reply: Any) -> int | None:
        self.token_usage.add(reply.prompt_tokens, 0, reply.cached_tokens)  # a prefill
        if reply.pin_id < 0:
            if reply.pin_error:  # the pin budget: the program runs on, its forks uncached
                warnings.warn(f"radixrt: {reply.pin_error}", RuntimeWarning, stacklevel=3)
            return None
        self._leases.hold(reply.pin_id)  # renewed in the background until unpinned
        return reply.pin_id

    def info(self) -> dict[str, Any]:
        """The runtime's server_info: cache_hit_rate, cached_tokens, kv counters, ..."""
        return dict(self._client.call(op="info").info)

    def flush_cache(self) -> int:
        """Drop every unlocked cached KV page of the runtime; returns the tokens freed."""
        return int(self._client.call(op="flush_cache").info.get("freed_tokens", 0))

    # --- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        self._leases.stop()
        self._client.close()

    def __enter__(self) -> ZmqRuntimeEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
