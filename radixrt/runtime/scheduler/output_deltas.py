"""Turn the requests a step touched into OutputDelta messages for the client side, and drop the
records of requests whose last delta has been sent."""

from __future__ import annotations

from collections.abc import Sequence

from radixrt.runtime.messages import OutputDelta
from radixrt.runtime.scheduler.request import Request
from radixrt.runtime.scheduler.scheduler import Scheduler


def collect_deltas(scheduler: Scheduler, touched: Sequence[Request]) -> list[OutputDelta]:
    deltas: list[OutputDelta] = []
    for req in touched:
        if req.finish_reason == "forked":
            continue  # its children carry the outputs from here on
        known = req.num_known_outputs  # in-flight placeholders are not sent
        if req.num_sent == known and not req.finished:
            continue
        owner = req.parent_rid if req.parent_rid is not None else req.rid
        first = req.num_sent == 0
        new = req.output_ids[req.num_sent : known]
        lps = req.output_logprobs[req.num_sent : known] if req.params.wants_logprobs else []
        req.num_sent = known
        parent = scheduler.requests.get(owner) if req.parent_rid is not None else req
        index = req.seed_offset if req.parent_rid is not None or req.params.n == 1 else -1
        deltas.append(
            OutputDelta(
                rid=req.rid,
                owner=owner,
                index=index,
                token_ids=new,
                logprobs=list(lps),
                finish_reason=req.finish_reason,
                cached_tokens=parent.cached_len if parent is not None else req.cached_len,
                prompt_logprobs=list(parent.prompt_logprobs) if first and parent else [],
            )
        )
        if req.finished:
            _forget(scheduler, req)
    return deltas


def _forget(scheduler: Scheduler, req: Request) -> None:
    scheduler.forget(req.rid)
    if req.parent_rid is None:
        return
    siblings = scheduler.children.get(req.parent_rid, [])
    if all(rid not in scheduler.requests for rid in siblings):
        scheduler.forget(req.parent_rid)
