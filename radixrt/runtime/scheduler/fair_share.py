"""Fair share between tenants: a virtual-time fair queue over the tokens each tenant is served.

Every tenant with requests in the scheduler has a virtual time: the tokens computed for it (prompt
chunks and decodes, as planned) since it became active. Admission within one priority level takes
the tenant with the least virtual time next (start-time fair queueing), so a tenant that queues
500 requests at once advances its own clock with each one it is served and another tenant's first
request goes ahead of the rest of the flood.

A tenant that becomes active starts at the smallest virtual time among the active tenants (never
below its own, if it is still remembered): idling earns no credit, so a newcomer is not owed the
service everyone else got while it was away, and it cannot starve them either. Tenants with nothing
in the scheduler are forgotten when the queue is next ordered, so the table stays as small as the
set of active tenants.

With one tenant the interleaving is the identity: the order is exactly the policy's.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from radixrt.runtime.scheduler.request import Request


class FairShare:
    def __init__(self) -> None:
        self.virtual: dict[str, float] = {}  # active tenant -> tokens served since activation

    def activate(self, tenant: str) -> None:
        """A request of `tenant` was queued: start its clock if it had none."""
        if tenant not in self.virtual:
            self.virtual[tenant] = min(self.virtual.values(), default=0.0)

    def charge(self, tenant: str, tokens: int) -> None:
        """`tokens` were planned for computation for `tenant`."""
        if tenant in self.virtual:
            self.virtual[tenant] += tokens

    def forget_idle(self, active: Iterable[str]) -> None:
        """Drop the clocks of tenants with nothing in the scheduler."""
        keep = set(active)
        self.virtual = {t: v for t, v in self.virtual.items() if t in keep}

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
