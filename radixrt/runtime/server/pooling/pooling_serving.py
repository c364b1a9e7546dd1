"""The pooling surface's handlers: inputs checked and bounded before anything is queued
(tokenizer/pooling_inputs.py), every input a prefill-only request submitted at once (so they
batch, and a shared prefix -- one instruction, one query -- is computed once through the radix
tree), the pooled vectors or head logits turned into each API's answer."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request

from radixrt.runtime.pooling_params import pack_floats
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.core.http_streaming import PromptOutput
from radixrt.runtime.server.openai.openai_serving import OpenAIServing
from radixrt.runtime.server.pooling.pooling_protocol import (
    ClassifyRequest,
    EmbeddingRequest,
    PoolingFields,
    RerankRequest,
)
from radixrt.runtime.tokenizer.pooling_inputs import (
    PoolingAborted,
    class_probs,
    embed_params,
    encode_inputs,
    pooled_result,
    rerank_ids,
    rerank_score,
    score_params,
)

T = TypeVar("T")


class PoolingServing:
    def __init__(self, chat: OpenAIServing) -> None:
        self.chat = chat  # the model names, encoding and streams the OpenAI routes use
        self.manager = chat.manager

    async def embeddings(self, body: EmbeddingRequest, request: Request) -> dict[str, Any]:
        self.chat.check_model(body.model)
        ids = self._encode(body.input, "input")
        params = self._params(lambda: embed_params(self.manager.pooling, body.dimensions,
                                                   body.normalize), "dimensions")
        outs, vectors = await self._run(request, body, ids, params)
        data = [{"object": "embedding", "index": i,
                 "embedding": (base64.b64encode(pack_floats(v)).decode()
                               if body.encoding_format == "base64" else v)}
                for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": body.model, "usage": _usage(outs)}

    async def rerank(self, body: RerankRequest, request: Request) -> dict[str, Any]:
        self.chat.check_model(body.model)
        docs = [d if isinstance(d, str) else d.text for d in body.documents]
        info = self.manager.pooling
        ids = self._params(lambda: rerank_ids(self.manager.tokenizer, info, body.query, docs,
                                              body.instruction), "documents")
        params = self._params(lambda: score_params(info), "model")
        outs, logits = await self._run(request, body, ids, params)
        scores = [rerank_score(info, one) for one in logits]
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[: body.top_n or len(docs)]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": docs[i]}} if body.return_documents else {})}
                   for i in order]
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": body.model, "results": results,
                "usage": _usage(outs)}

    async def classify(self, body: ClassifyRequest, request: Request) -> Any:
        self.chat.check_model(body.model)
        given = [name for name in ("input", "text", "input_ids") if getattr(body, name) is not None]
        if len(given) != 1:
            raise APIError("give one of `input` (vLLM's classify), `text` or `input_ids` "
                           "(SGLang's reward scoring)", param="input")
        info = self.manager.pooling
        if not info.num_labels:
            raise APIError("this model has no classification head: serve a "
                           "*ForSequenceClassification checkpoint (a classifier or a reward "
                           "model)", param="model")
        value = getattr(body, given[0])
        ids = self._encode(value, given[0])
        outs, logits = await self._run(request, body, ids, score_params(info))
        if given[0] != "input":  # SGLang's shape: one dict for one text, else a list
            answers = [{"embedding": one, "meta_info": {"prompt_tokens": out.prompt_tokens,
                                                       "cached_tokens": out.cached_tokens}}
                       for one, out in zip(logits, outs)]
            single = isinstance(value, str) or (bool(value) and isinstance(value[0], int))
            return answers[0] if single else answers
        data = []
        for i, one in enumerate(logits):
            probs = class_probs(one)
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append({"index": i, "label": info.labels[best] if info.labels else str(best),
                         "probs": probs, "num_classes": len(probs)})
        return {"id": f"classify-{uuid.uuid4().hex}", "object": "list",
                "created": int(time.time()), "model": body.model, "data": data,
                "usage": _usage(outs)}

    # --- shared steps ----------------------------------------------------------------------
    def _encode(self, value: Any, param: str) -> list[list[int]]:
        """One input (text or token ids) or a list of them, bounded, as token ids."""
        return self._params(lambda: encode_inputs(self.manager.encode, value, param), param)

    @staticmethod
    def _params(build: Callable[[], T], param: str) -> T:
        try:
            return build()
        except ValueError as exc:
            raise APIError(str(exc), param=param) from None

    async def _run(self, request: Request, body: PoolingFields, ids: list[list[int]],
                   params: SamplingParams) -> tuple[list[PromptOutput], list[list[float]]]:
        """Every input submitted at once; their outputs and vectors (or logits)."""
        streams = await self.chat.open(request, body, ids, [params] * len(ids),  # type: ignore[arg-type]
                                       f"pool-{uuid.uuid4().hex}")
        outs = await self.chat.collect(request, streams, ids, 1)
        try:
            results = [pooled_result(out.pooled, out.samples[0].finish_reason, i)
                       for i, out in enumerate(outs)]
        except PoolingAborted as exc:
            raise APIError(f"{exc} (POST /abort, or the server stopping)", status=503,
                           code="aborted") from None
        except ValueError as exc:
            raise APIError(str(exc)) from None
        return outs, results


def _usage(outs: list[PromptOutput]) -> dict[str, int]:
    tokens = sum(out.prompt_tokens for out in outs)
    return {"prompt_tokens": tokens, "total_tokens": tokens,
            "cached_tokens": sum(out.cached_tokens for out in outs)}
