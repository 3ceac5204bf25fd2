"""The worker's queries (sql/queries/worker.sql): claim, record and release deliveries, the
wakeup row, crash records, failure lifecycle rounds and the queue's partitions."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict, TypeVar

from psycopg import sql
from psycopg.rows import class_row

from service.store.base import AsyncQueries, one_signature

Claimed = TypeVar("Claimed")


class LeaseParams(TypedDict):
    """What a statement that leases deliveries to this worker is told of its caps and of
    what it has in flight: the claim's, and the fan-out's on a quiet queue."""

    per_target: int
    per_owner: int
    lease: float
    busy_ids: list[int]
    busy_counts: list[int]
    saturated: list[int]
    degraded: list[int]
    owner_names: list[str]
    owner_counts: list[int]
    saturated_owners: list[str]
    # The queue's floor (sql/partitions.sql) as the worker last read it; None: not known.
    since: datetime | None


class ClaimParams(LeaseParams):
    """The parameters of the claim query (service.worker.pacing.claim_params)."""

    limit: int
    scan: int
    # The queues the worker's lane keeps (others_due), and the day of each one's first
    # due delivery when the lane found it.
    lane_sids: list[int]
    lane_since: list[datetime]


class OthersDue(TypedDict):
    """What the lane for other queues found (others_due in sql/queries/worker.sql): the
    subscriptions with due deliveries, their owners and their first due one's day."""

    last: int
    sids: list[int]
    owners: list[str]
    created: list[datetime]


class WorkerQueries(AsyncQueries):
    """What the worker's loop and its side tasks run, each on a connection of its own."""

    async def claim(self, into: type[Claimed], params: ClaimParams) -> list[Claimed]:
        """Leases up to `limit` due deliveries below their caps, as `into` (unordered);
        `since`: the queue's floor as last read (None: every partition is read)."""
        return await self._all("claim", one_signature(params), row=class_row(into))

    async def others_due(self, *, after: int, steps: int, take: int, busy: list[int],
                         since: datetime | None = None) -> OthersDue:
        """The subscriptions with a due delivery among those with pending deliveries,
        walked in id order from `after` (at most `steps`), but for the `busy` ones (those
        this worker holds claims of), at most `take` (one per owner first), for the
        claims to take from beside the oldest; `since`: the queue's floor (None: every
        partition is read)."""
        row = await self._one("others_due", one_signature({
            "after": after, "steps": steps, "take": take, "busy": busy, "since": since}))
        assert row is not None
        return {"last": row["last"], "sids": list(row["sids"]),
                "owners": list(row["owners"]), "created": list(row["created"])}

    async def next_due(self, *, saturated: list[int], saturated_owners: list[str]
                       ) -> tuple[float | None, datetime | None]:
        """Seconds until the next claimable delivery is due (None when none is pending),
        and the queue's floor (None when there is none)."""
        row = await self._one("next_due", {"saturated": saturated,
                                           "saturated_owners": saturated_owners})
        return (row["wait"], row["since"]) if row else (None, None)

    async def refresh_queue_floor(self) -> datetime | None:
        """Raises the queue's floor to what is pending now (sql/partitions.sql); returns
        it (None when there is none)."""
        row = await self._one("refresh_queue_floor", {})
        return row["since"] if row else None

    async def record(self, *, batch: str) -> list[int]:
        """Writes a JSON batch of finished attempts and their deliveries' new state;
        returns the strict subscriptions whose head finished, for `unpark`."""
        row = await self._one("record", {"batch": batch})
        return list(row["finished_strict"]) if row else []

    async def unpark(self, *, subscription_ids: list[int]) -> None:
        """The next delivery of each strict subscription comes due (sql/ordering.sql)."""
        await self._one("unpark", {"subscription_ids": subscription_ids})

    async def stop_gone(self, *, subscription_ids: list[int]) -> None:
        """Deactivates the subscriptions whose targets answered that they are gone."""
        await self._run("stop_gone", {"subscription_ids": subscription_ids})

    async def close_inactive(self, *, subscription_ids: list[int], limit: int) -> int:
        """Closes up to `limit` due deliveries of these subscriptions, if inactive; how many."""
        return await self._run("close_inactive", one_signature({
            "subscription_ids": subscription_ids, "limit": limit}))

    async def release(self, *, ids: list[int], attempts: list[int], dues: list[datetime]
                      ) -> None:
        """Gives claimed deliveries back, due again at the time they were due when claimed
        (`dues`, at the latest now), their attempt not counted."""
        await self._run("release", {"ids": ids, "attempts": attempts, "dues": dues})

    async def ensure_partitions(self, *, ahead: int) -> None:
        """Creates the queue's partitions up to `ahead` days from today."""
        await self._one("partitions_ensure", {"ahead": ahead})

    async def prune_worker_tasks(self, *, retention: float) -> None:
        """Deletes the crash records older than `retention` seconds."""
        await self._run("prune_worker_tasks", {"retention": retention})

    async def arm_wakeup(self, *, pid: int | None, old_pid: int | None) -> None:
        """Asks for a NOTIFY to the listener `pid` (replacing `old_pid`'s row)."""
        await self._run("wakeup_arm", {"pid": pid, "old_pid": old_pid})

    async def disarm_wakeup(self, *, pid: int) -> None:
        """Removes the listener's wakeup row."""
        await self._run("wakeup_disarm", {"pid": pid})

    async def task_crashed(self, *, worker: str, task: str, restarts: int,
                           error: str | None) -> None:
        """Records a crash of a worker's task in webhooks.worker_tasks."""
        await self._run("task_crashed", {"worker": worker, "task": task,
                                         "restarts": restarts, "error": error})

    async def lifecycle_round(self, *, failing_after: float, disable_after: float
                              ) -> list[dict[str, Any]]:
        """One failure-lifecycle round: the subscriptions it moved and what it queued."""
        return await self._all("lifecycle", {"failing_after": failing_after,
                                             "disable_after": disable_after})


class ConnectionQueries(AsyncQueries):
    """Statements whose effect stays on their connection (a LISTEN, a session lock or
    setting): only a Session, which keeps one connection, has them."""

    async def _execute(self, statement: sql.Composed | sql.SQL) -> None:
        """Runs a statement composed with psycopg.sql (DDL that names relations)."""
        raise NotImplementedError

    async def listen(self) -> None:
        """LISTENs on the service's channel."""
        await self._run("listen")

    async def prove_listener(self, report: str) -> None:
        """The LISTEN connection's proof of life: a round trip whose text carries `report`
        (JSON), read by `webhooks status` from pg_stat_activity (status_workers)."""
        await self._execute(sql.SQL("SELECT {} AS webhooks_progress").format(
            sql.Literal(report)))

    async def lock_partitions(self, *, key: int) -> bool:
        """Takes the pruner's session lock; False when another pruner holds it."""
        row = await self._one("partitions_lock", {"key": key})
        return bool(row["locked"])

    async def unlock_partitions(self, *, key: int) -> None:
        """Releases the pruner's session lock."""
        await self._one("partitions_unlock", {"key": key})

    async def close_orphan_partitions(self) -> None:
        """Finishes the detaches an interrupted pruner left pending."""
        await self._one("partitions_close_orphans")

    async def expired_partitions(self, *, retention: float) -> list[dict[str, Any]]:
        """The partitions past retention ({"parent", "partition", bounds, "detach_pending"})."""
        return await self._all("partitions_expired", {"retention": retention})

    async def keep_detached(self, *, partition: str, lower_bound: str, upper_bound: str,
                            retention: float) -> bool:
        """Moves back a detached deliveries partition's requeued deliveries; whether any."""
        row = await self._one("partitions_keep_detached", {
            "partition": partition, "lower_bound": lower_bound, "upper_bound": upper_bound,
            "retention": retention})
        return bool(row["kept"])

    async def set_lock_timeout(self, timeout: str) -> None:
        """Bounds the wait for a lock by the connection's next statements."""
        await self._execute(sql.SQL("SET lock_timeout = {}").format(timeout))

    async def reset_lock_timeout(self) -> None:
        """Lifts the bound set by set_lock_timeout."""
        await self._execute(sql.SQL("RESET lock_timeout"))

    async def detach_partition(self, *, parent: str, partition: str, finalize: bool) -> None:
        """Detaches a queue partition (concurrently, or finalizing a pending detach)."""
        how = sql.SQL("FINALIZE" if finalize else "CONCURRENTLY")
        await self._execute(sql.SQL("ALTER TABLE {} DETACH PARTITION {} {}").format(
            sql.Identifier("webhooks", parent), sql.Identifier("webhooks", partition), how))

    async def current_partitions(self) -> list[str]:
        """The deliveries partitions being filled."""
        return [row["partition"] for row in await self._all("current_partitions")]

    async def maintain_partition(self, *, partition: str, vacuum: bool) -> None:
        """ANALYZE, or with `vacuum` VACUUM (ANALYZE), of one queue partition (outside any
        transaction: a Session's connection is in autocommit). A role that does not own
        it gets a warning."""
        how = sql.SQL("VACUUM (ANALYZE)" if vacuum else "ANALYZE")
        await self._execute(sql.SQL("{} {}").format(how, sql.Identifier("webhooks", partition)))

    async def drop_partition(self, *, partition: str) -> None:
        """Drops a detached queue partition."""
        await self._execute(sql.SQL("DROP TABLE {}").format(
            sql.Identifier("webhooks", partition)))
