"""Fair share between tenants: a virtual-time fair queue over the tokens each tenant is served.

Every tenant has a virtual time: the tokens computed for it (prompt chunks and decodes, as
planned) in the current busy period. Admission within one priority level takes the tenant with
the least virtual time next (start-time fair queueing), so a tenant that queues 500 requests at
once advances its own clock with each one it is served and another tenant's first request goes
ahead of the rest of the flood.

Idling earns no credit. A busy period lasts while anything is waiting: service is counted only
then, and when the waiting queue empties every clock is dropped, so tenants that meet in the
next busy period start level (whatever ran while nobody waited is not counted). Within a busy
period, a tenant whose first request joins the queue (it becomes backlogged) starts at the least
clock among the tenants already waiting, never below its own: service it got while it had
nothing waiting (a long request running alone) or time it spent away is not owed to it, and it
cannot starve the others either.

With one tenant the interleaving is the identity: the order is exactly the policy's.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from radixrt.runtime.scheduler.request import Request


class FairShare:
    def __init__(self) -> None:
        self.virtual: dict[str, float] = {}  # tenant -> tokens served in this busy period
        self.busy = False  # something is waiting

    def backlogged(self, tenant: str, waiting: Iterable[str]) -> None:
        """`tenant` has its first waiting request; `waiting`: the other tenants with waiting
        requests. Its clock starts at the least of theirs, never below its own."""
        self.busy = True
        own = self.virtual.get(tenant, 0.0)
        others = [self.virtual.get(t, 0.0) for t in waiting if t != tenant]
        self.virtual[tenant] = max(own, min(others)) if others else own

    def charge(self, tenant: str, tokens: int) -> None:
        """`tokens` were planned for computation for `tenant` (counted in a busy period)."""
        if self.busy:
            self.virtual[tenant] = self.virtual.get(tenant, 0.0) + tokens

    def idle(self) -> None:
        """The waiting queue is empty: the busy period ends, every clock with it."""
        self.virtual.clear()
        self.busy = False

    def interleave(self, ordered: Sequence[Request]) -> list[Request]:
        """`ordered` (one priority level, in policy order) interleaved between tenants: each
        next request comes from the tenant with the least virtual time, counting what the
        requests already placed would be served (their known tokens); within a tenant, the
        policy's order. Ties go to the tenant whose next request came first in `ordered`."""
        queues: dict[str, list[Request]] = {}
        for req in ordered:
            queues.setdefault(req.tenant, []).append(req)
        if len(queues) <= 1:
            return list(ordered)
        position = {id(req): i for i, req in enumerate(ordered)}
        heads = {t: 0 for t in queues}
        heap = [(self.virtual.get(t, 0.0), position[id(q[0])], t) for t, q in queues.items()]
        heapq.heapify(heap)
        out: list[Request] = []
        while heap:
            clock, _, tenant = heapq.heappop(heap)
            queue = queues[tenant]
            req = queue[heads[tenant]]
            out.append(req)
            heads[tenant] += 1
            if heads[tenant] < len(queue):
                nxt = queue[heads[tenant]]
                heapq.heappush(heap, (clock + max(req.num_tokens, 1), position[id(nxt)], tenant))
        return out
