"""The order in which waiting requests are admitted: priority first (lower is more urgent), then
fair share between tenants (fair_share.py), then the schedule policy (policy.py) within each.

The policy orders each priority level on its own, so `lpm`'s cache-awareness and `dfs-weight`'s
tree walk apply within a level; fair share then interleaves that level's tenants, keeping each
tenant's requests in the policy's order. With one priority and one tenant the order is exactly the
policy's.
"""

from __future__ import annotations

from radixrt.runtime.scheduler.fair_share import FairShare
from radixrt.runtime.scheduler.kv_manager import KVManager
from radixrt.runtime.scheduler.policy import SchedulePolicy
from radixrt.runtime.scheduler.request import Request


def admission_order(
    waiting: list[Request], kv: KVManager, policy: SchedulePolicy, fair: FairShare | None
) -> list[Request]:
    levels: dict[int, list[Request]] = {}
    for req in waiting:
        levels.setdefault(req.priority, []).append(req)
    ordered: list[Request] = []
    for priority in sorted(levels):
        level = policy.order(levels[priority], kv)
        ordered += fair.interleave(level) if fair is not None else level
    return ordered


def most_urgent(requests: list[Request]) -> int | None:
    """The smallest priority among `requests` (None when there are none)."""
    return min((r.priority for r in requests), default=None)
