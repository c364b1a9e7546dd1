"""The pooling surface's handlers: inputs checked and bounded before anything is queued
(tokenizer/pooling_inputs.py), every input a prefill-only request submitted at once (so they
batch, and a shared prefix -- one instruction, one query -- is computed once through the radix
tree), the pooled vectors or head logits turned into each API's answer."""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

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
    MAX_POOLING_INPUTS,
    MAX_RERANK_DOCUMENTS,
    check_total,
    class_probs,
    embed_params,
    rerank_ids,
    rerank_score,
    score_params,
)
from radixrt.runtime.tokenizer.prompts import Prompt


class PoolingServing:
    def __init__(self, chat: OpenAIServing) -> None:
        self.chat = chat  # the model names, encoding and streams the OpenAI routes use
        self.manager = chat.manager
        self.counts: dict[str, int] = {}  # inputs answered per task, for /metrics

    async def embeddings(self, body: EmbeddingRequest, request: Request) -> dict[str, Any]:
        inputs = self._inputs(body.input, "input")
        ids = [self.chat.encode(p, "input") for p in inputs]
        params = self._params(lambda: embed_params(self.manager.pooling, body.dimensions,
                                                   body.normalize), "dimensions")
        outs = await self._run(request, body, ids, params, "embed")
        data = [{"object": "embedding", "index": i,
                 "embedding": (base64.b64encode(pack_floats(out.pooled)).decode()
                               if body.encoding_format == "base64" else out.pooled)}
                for i, out in enumerate(outs)]
        return {"object": "list", "data": data, "model": body.model, "usage": _usage(outs)}

    async def rerank(self, body: RerankRequest, request: Request) -> dict[str, Any]:
        docs = [d if isinstance(d, str) else d.text for d in body.documents]
        if not docs:
            raise APIError("documents is empty: give at least one", param="documents")
        if len(docs) > MAX_RERANK_DOCUMENTS:
            raise APIError(f"documents has {len(docs)} entries: at most "
                           f"{MAX_RERANK_DOCUMENTS} per request", param="documents")
        info = self.manager.pooling
        try:
            ids = rerank_ids(self.manager.tokenizer, info, body.query, docs, body.instruction)
            params = score_params(info)
        except ValueError as exc:
            raise APIError(str(exc), param="model") from None
        outs = await self._run(request, body, ids, params, "rerank")
        scores = [rerank_score(info, out.pooled) for out in outs]
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[: body.top_n or len(docs)]
        results = [{"index": i, "relevance_score": scores[i],
                    **({"document": {"text": docs[i]}} if body.return_documents else {})}
                   for i in order]
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": body.model, "results": results,
                "usage": _usage(outs)}

    async def classify(self, body: ClassifyRequest, request: Request) -> Any:
        if (body.input is None) == (body.text is None):
            raise APIError("give `input` (vLLM's classify) or `text` (SGLang's reward "
                           "scoring), one of them", param="input")
        sglang = body.text is not None
        inputs = self._inputs(body.text if sglang else body.input, "text" if sglang else "input")
        ids = [self.chat.encode(p, "input") for p in inputs]
        info = self.manager.pooling
        if not info.num_labels:
            raise APIError("this model has no classification head: serve a "
                           "*ForSequenceClassification checkpoint (a classifier or a reward "
                           "model)", param="model")
        outs = await self._run(request, body, ids, score_params(info), "classify")
        if sglang:
            return [{"index": i, "embedding": out.pooled,
                     "meta_info": {"prompt_tokens": out.prompt_tokens,
                                   "cached_tokens": out.cached_tokens}}
                    for i, out in enumerate(outs)]
        data = []
        for i, out in enumerate(outs):
            probs = class_probs(out.pooled)
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append({"index": i, "label": info.labels[best] if info.labels else str(best),
                         "probs": probs, "num_classes": len(probs)})
        return {"id": f"classify-{uuid.uuid4().hex}", "object": "list",
                "created": int(time.time()), "model": body.model, "data": data,
                "usage": _usage(outs)}

    # --- shared steps ----------------------------------------------------------------------
    @staticmethod
    def _inputs(value: Any, param: str) -> list[Prompt]:
        """One input (text or token ids) or a list of them, bounded."""
        if isinstance(value, str):
            return [value]
        if not value:
            raise APIError(f"{param} is empty: give text, token ids or a list of them",
                           param=param)
        if isinstance(value[0], int):
            return [value]
        if len(value) > MAX_POOLING_INPUTS:
            raise APIError(f"{param} has {len(value)} entries: at most {MAX_POOLING_INPUTS} "
                           "per request; split them", param=param)
        return list(value)

    @staticmethod
    def _params(build: Any, param: str) -> SamplingParams:
        try:
            return build()
        except ValueError as exc:
            raise APIError(str(exc), param=param) from None

    async def _run(self, request: Request, body: PoolingFields, ids: list[list[int]],
                   params: SamplingParams, task: str) -> list[PromptOutput]:
        self.chat.check_model(body.model)
        try:
            check_total(ids)
        except ValueError as exc:
            raise APIError(str(exc), param="input") from None
        streams = await self.chat.open(request, body, ids, [params] * len(ids),  # type: ignore[arg-type]
                                       f"pool-{uuid.uuid4().hex}")
        outs = await self.chat.collect(request, streams, ids, 1)
        self.counts[task] = self.counts.get(task, 0) + len(outs)
        return outs


def _usage(outs: list[PromptOutput]) -> dict[str, int]:
    tokens = sum(out.prompt_tokens for out in outs)
    return {"prompt_tokens": tokens, "total_tokens": tokens,
            "cached_tokens": sum(out.cached_tokens for out in outs)}
