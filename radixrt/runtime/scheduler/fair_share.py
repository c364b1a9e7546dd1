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

Weights: a tenant of weight w advances its clock by tokens / w, so over a busy period the tenants'
served tokens go as their weights (default 1).

With one tenant the interleaving is the identity: the order is exactly the policy's.

`over_share_victim` is fair share's rule for preemption (preemption.py makes room with it), for a
tenant with waiting requests against the running requests of other tenants of its priority:

- a tenant that holds no running slot takes one (and the KV pages its request needs) from any
  other tenant: every backlogged tenant runs something within about a quantum, however long the
  others' requests are. A tenant that gave a slot up this way claims none for a quantum of
  steps (it would take the next one at once, and the next tenant after it, in a cascade): with
  more backlogged tenants than slots, the slots rotate, one move a quantum;
- otherwise it takes a slot (or KV pages) only from a tenant that, after giving it, still holds
  at least as much per unit of weight as the taker would. Such a move can never be undone by the
  same rule (the giver holds more per weight than the taker held before): shares settle and
  nothing ping-pongs.

The giver is the tenant holding the most per unit of weight, then the one served most (its
clock); its request that loses least goes (least output, most recently admitted). No request
is preempted before it has written a quantum of tokens since its admission (preemption.py), so
every admission makes progress. With one tenant nothing applies.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from radixrt.runtime.scheduler.request import Request


class FairShare:
    def __init__(self, weights: Mapping[str, float] | None = None, quantum: int = 1) -> None:
        self.weights = dict(weights or {})  # tenant -> weight (absent: 1)
        self.quantum = quantum  # EngineConfig.fair_share_quantum, here in steps
        self.virtual: dict[str, float] = {}  # tenant -> tokens served / weight, this busy period
        self.gave_up: dict[str, int] = {}  # tenant -> step it last lost a slot to fair share
        self.busy = False  # something is waiting

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def preempted(self, tenant: str, step: int) -> None:
        """A request of `tenant` was preempted for fair share in plan `step`."""
        self.gave_up[tenant] = step

    def may_claim_first_slot(self, tenant: str, step: int) -> bool:
        """Whether `tenant`, holding no running slot, may take one in plan `step`: unless it
        gave one up to fair share less than a quantum ago."""
        gave_up = self.gave_up.get(tenant)
        return gave_up is None or step - gave_up >= self.quantum

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
            self.virtual[tenant] = self.virtual.get(tenant, 0.0) + tokens / self.weight(tenant)

    def idle(self) -> None:
        """The waiting queue is empty: the busy period ends, every clock with it."""
        self.virtual.clear()
        self.gave_up.clear()
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
                served = max(req.num_tokens, 1) / self.weight(tenant)
                heapq.heappush(heap, (clock + served, position[id(nxt)], tenant))
        return out


class Holdings:
    """What each tenant of one priority holds while room is being made (running slots and KV
    tokens), including the requests placed ahead of the one room is made for and less the
    victims already chosen. KV is counted in distinct pages per tenant, so a prompt its
    requests share counts once; it is counted only when KV is short (it walks the pages)."""

    def __init__(self, running: Iterable[Request], page_size: int) -> None:
        self.page_size = page_size
        self._running = list(running)
        self.slots: Counter[str] = Counter(r.tenant for r in self._running)
        self._tokens: Counter[str] = Counter()  # of requests placed, then of every page
        self._users: Counter[tuple[str, int]] | None = None  # (tenant, page) -> requests

    def _counted(self) -> Counter[tuple[str, int]]:
        if self._users is None:
            self._users = Counter()
            for req in self._running:
                for page in req.pages:
                    self._hold(req.tenant, page, +1)
        return self._users

    def _hold(self, tenant: str, page: int, change: int) -> None:
        users = self._users
        assert users is not None
        before = users[(tenant, page)]
        users[(tenant, page)] = before + change
        if (before == 0) != (before + change == 0):
            self._tokens[tenant] += self.page_size * change

    def tokens(self, tenant: str) -> int:
        self._counted()
        return self._tokens[tenant]

    def freed_by(self, req: Request) -> int:
        """KV tokens its tenant stops holding if `req` is preempted."""
        users = self._counted()
        return self.page_size * sum(1 for page in req.pages if users[(req.tenant, page)] == 1)

    def place(self, tenant: str, tokens: int) -> None:
        """A waiting request of `tenant` takes a slot and `tokens` (its first chunk and its
        cached prefix)."""
        self.slots[tenant] += 1
        self._tokens[tenant] += tokens

    def remove(self, req: Request) -> None:
        """`req` is about to be preempted (its pages are still its own)."""
        self.slots[req.tenant] -= 1
        if self._users is None:
            self._running.remove(req)
            return
        for page in req.pages:
            self._hold(req.tenant, page, -1)


def over_share_victim(taker: str, need_slot: bool, need_tokens: int, holdings: Holdings,
                      candidates: Iterable[Request], fair: FairShare,
                      step: int) -> Request | None:
    """The running request (among `candidates`, of the taker's priority) that tenant `taker`
    may preempt for a running slot (`need_slot`) and/or `need_tokens` KV tokens (0: none), by
    the rule in the module docstring; the one that loses least. `step`: the plan being made.
    None when no tenant is over its share."""
    w_taker = fair.weight(taker)
    first_slot = holdings.slots[taker] <= 0 and fair.may_claim_first_slot(taker, step)

    def gives_fairly(victim: Request) -> bool:
        if victim.tenant == taker:
            return False
        if first_slot:
            return True
        w = fair.weight(victim.tenant)
        if need_slot and (holdings.slots[taker] + 1) / w_taker > (
                holdings.slots[victim.tenant] - 1) / w:
            return False
        return not need_tokens or (holdings.tokens(taker) + need_tokens) / w_taker <= (
            holdings.tokens(victim.tenant) - holdings.freed_by(victim)) / w

    def loses_least(r: Request) -> tuple[float, float, int, int]:
        w = fair.weight(r.tenant)
        return (-holdings.slots[r.tenant] / w, -fair.virtual.get(r.tenant, 0.0),
                r.num_known_outputs, -r.admitted_at)

    return min(filter(gives_fairly, candidates), key=loses_least, default=None)
