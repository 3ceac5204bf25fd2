"""A claim made directly, outside a worker: the claim query with the parameters the
worker's pacing builds (service.worker.pacing.claim_params), its rows in start order."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from service.store import Store
from service.worker.delivery import Claim, in_start_order
from service.worker.pacing import claim_params


async def claim(store: Store, *, limit: int, per_target: int,
                busy: Mapping[int, int], lease: float, scan: int,
                degraded: Collection[int] = (), per_owner: int | None = None,
                busy_owners: Mapping[str, int] | None = None) -> list[Claim]:
    """Claims up to `limit` due deliveries, committed before returning, in start order.

    `busy` maps subscription ids to deliveries in flight for them; none gets more than
    `per_target` in flight, and the `degraded` ones (whose last attempt failed) no more
    than one. `busy_owners` does the same per owner, capped at `per_owner` (None: no cap).
    Deliveries of inactive subscriptions are closed as failed and not returned.
    """
    rows = await store.claim(Claim, claim_params(
        limit=limit, per_target=per_target, busy=busy, lease=lease, scan=scan,
        degraded=degraded, per_owner=per_owner, busy_owners=busy_owners))
    return in_start_order(rows)
