"""Client-side assembly of one request's output from OutputDelta messages: incremental
detokenization per sample, stop strings, logprobs, and the StreamChunks a stream yields."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.messages import OutputDelta
from radixrt.runtime.outputs import CompletionOutput, RequestOutput, StreamChunk
from radixrt.runtime.pooling_params import unpack_floats
from radixrt.runtime.sampling_params import SamplingParams
from radixrt.runtime.tokenizer.detokenizer import IncrementalDetokenizer


class OutputTracker:
    def __init__(
        self, tokenizer: Any, rid: int, prompt_ids: list[int], params: SamplingParams
    ) -> None:
        self.params = params
        self.output = RequestOutput(
            rid=rid,
            prompt_token_ids=prompt_ids,
            samples=[CompletionOutput(index=i) for i in range(params.n)],
        )
        self._detoks = [
            IncrementalDetokenizer(tokenizer, prompt_ids, params.skip_special_tokens, params.stop)
            for _ in range(params.n)
        ]

    @property
    def finished(self) -> bool:
        return self.output.finished

    def apply(self, delta: OutputDelta) -> tuple[list[StreamChunk], bool]:
        """Fold a delta in. Returns the chunks for a stream, and True when a stop string ended
        this sample here (the caller then ends the request on the scheduler side)."""
        out = self.output
        out.cached_tokens = delta.cached_tokens
        out.pinned = out.pinned or delta.pinned
        out.pin_error = out.pin_error or delta.pin_error
        if delta.prompt_logprobs:
            out.prompt_logprobs = list(delta.prompt_logprobs)
        if delta.pooled:
            out.pooled = unpack_floats(delta.pooled)
        if delta.index < 0:  # n > 1 request that ended before it forked
            chunks = []
            for sample in out.samples:
                if sample.finish_reason is None:
                    sample.finish_reason = delta.finish_reason
                    chunks.append(
                        StreamChunk(out.rid, sample.index, "", [], delta.finish_reason,
                                    trace=None if chunks else delta.trace)
                    )
            return chunks, False
        sample = out.samples[delta.index]
        if sample.finish_reason is not None:
            return [], False  # already ended here by a stop string
        detok = self._detoks[delta.index]
        token_ids, logprobs = delta.token_ids, delta.logprobs
        text = ""
        if self.params.stop and len(token_ids) > 1:
            # several tokens at once (speculative decoding, jump-forward): a stop string ends
            # the sample at the token that completes it, as one token per delta would
            for taken, token in enumerate(token_ids, 1):
                text += detok.add([token])
                if detok.stopped:
                    token_ids, logprobs = token_ids[:taken], logprobs[:taken]
                    break
        elif token_ids:
            text = detok.add(token_ids)
        stopped_here = detok.stopped and delta.finish_reason is None
        reason = "stop" if detok.stopped else delta.finish_reason
        if reason is not None:
            text += detok.finish()
        sample.token_ids.extend(token_ids)
        sample.logprobs.extend(logprobs)
        sample.text += text
        sample.finish_reason = reason
        sample.matched_stop = detok.stop_reason if detok.stopped else None
        chunk = StreamChunk(
            rid=out.rid,
            index=sample.index,
            text=text,
            token_ids=list(token_ids),
            finish_reason=reason,
            logprobs=list(logprobs),
            cached_tokens=delta.cached_tokens,
            prompt_logprobs=list(delta.prompt_logprobs),
            queue_s=delta.queue_s,
            prefill_s=delta.prefill_s,
            pinned=delta.pinned,
            pin_error=delta.pin_error,
            matched_stop=sample.matched_stop,
            pooled=out.pooled if delta.pooled else [],
            trace=delta.trace,
        )
        return [chunk], stopped_here
