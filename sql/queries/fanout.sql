-- Fan-out: captured changes leave the outbox as events and deliveries; loaded by
-- service.db.queries().

-- name: fanout --
-- Moves one batch of captured statements out of the outbox, one change per row they
-- changed. Only changes some active subscription wants are kept as events, each with its
-- delivery body built once, here, and one delivery per matching subscription, created in
-- capture order. The advisory lock keeps fan-out to one worker at a time, so deliveries
-- are created in event order even when many workers run; a worker that does not get it
-- skips (the holder drains the outbox).
-- A quiet queue's deliveries are made leased: when %(take)s (the deliveries the worker has
-- room for; 0 leases nothing) covers every delivery of a small batch and no pending delivery
-- is due, those of unordered subscriptions within this worker's caps (the claim's
-- parameters: per subscription, degraded, per owner) are created claimed by it, with
-- their lease, attempt 1 and what sending needs, returned in `claims`; the claim's
-- statement and its rewrite of each row are saved on a fresh change's way to its POST.
-- Nothing else being due keeps each subscription's first attempts in event order, as the
-- claim starts them; `quiet` says whether that held, so that the worker claims what was
-- due instead.
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(%(lock_key)s) AS ok
), busy AS (
    SELECT sid, n FROM unnest(%(busy_ids)s::bigint[], %(busy_counts)s::int[]) AS b (sid, n)
), busy_owners AS (
    SELECT owner, n
      FROM unnest(%(owner_names)s::text[], %(owner_counts)s::int[]) AS b (owner, n)
), quiet AS (
    -- One probe of the due index from the queue's floor, %(since)s, as the claim's (a floor
    -- lowered since the worker read it is not quiet); not run when nothing is to be leased.
    SELECT %(take)s::int > 0
           AND (%(since)s::timestamptz IS NULL
                OR %(since)s::timestamptz
                   <= coalesce((SELECT f.since FROM webhooks.queue_floor f), '-infinity'))
           AND NOT EXISTS (SELECT 1 FROM webhooks.deliveries d
                            WHERE d.status = 'pending' AND d.next_attempt_at <= now()
                              AND d.created_at >= coalesce(%(since)s::timestamptz,
                                                           '-infinity')
                              AND d.created_at <= now()) AS ok
), batch AS (
    DELETE FROM webhooks.outbox o
     WHERE o.id IN (SELECT id FROM webhooks.outbox
                     WHERE (SELECT ok FROM lock)
                     ORDER BY id
                     LIMIT %(limit)s
                     FOR UPDATE SKIP LOCKED)
    RETURNING o.id, o
), changes AS (
    -- The row before as JSONB (change_rows' previous) is left out: nothing here reads it.
    -- The row as JSONB (row_data) stays, parsed once per change: the filters of every
    -- subscription the change reaches read it (parsed in each filter's call instead, ten
    -- 100 kB rows before 1,000 filtered subscriptions took 1.8 s instead of 34 ms).
    -- The statements come sorted by id, so only each one's changes are sorted, in memory
    -- (sorting all of them, about 1 kB each for a 600-byte row, spilled past 4 MB of
    -- work_mem: about 4,000 changes).
    SELECT nextval('webhooks.event_ids'::regclass) AS event_id, ordered.hook_resource,
           ordered.name, ordered.resource, ordered.parent_resource, ordered.occurred_at,
           ordered.xid, ordered.audience, ordered.traceparent, ordered.tracestate,
           ordered.resource_id, ordered.parent_id, ordered.user_id,
           ordered.tenant_scoped, ordered.tenant, ordered.row_data, ordered.problem,
           ordered.raw, ordered.changed, ordered.row_json, ordered.previous_json
      FROM (SELECT (b.o).hook_resource, (b.o).name, (b.o).resource, (b.o).parent_resource,
                   (b.o).occurred_at, (b.o).xid, (b.o).audience, (b.o).traceparent,
                   (b.o).tracestate, c.*
              FROM (SELECT bb.id, bb.o FROM batch bb ORDER BY bb.id) b
             CROSS JOIN LATERAL webhooks.change_rows(b.o, %(careful)s) c
             ORDER BY b.id, c.n) ordered
), rejected AS (
    -- Careful mode only: changes that cannot become events are set aside, with why.
    INSERT INTO webhooks.rejected_changes (table_name, event, reason, row_text)
    SELECT coalesce((SELECT a.table_oid::text FROM webhooks.attachments a
                      WHERE a.resource = ch.resource), ch.resource),
           ch.name, ch.problem, left(ch.raw::text, 65536)
      FROM changes ch
     WHERE ch.problem IS NOT NULL
    RETURNING 1
), matched AS (
    -- Active subscriptions that want the event, by index on (resource, event, tenant),
    -- in three arms so each is an index lookup: subscriptions without a tenant, those of
    -- the change's tenant, and every tenant's when the table has no tenant column. A row
    -- that moved between tenants came as an .update for subscriptions without a tenant
    -- (audience 'untenanted') and as the old tenant's .delete and the new tenant's
    -- .create for tenant-scoped ones ('tenanted': sql/triggers/capture.sql).
    -- The arms are a lookup per change (the OFFSET 0 keeps them one): joined as a whole,
    -- the generic plan hashed every subscription of every resource for each batch (3 ms
    -- per fan-out beside 3,000 subscriptions of another resource).
    -- A subscription whose activation saw the writing transaction as committed (it was
    -- inactive, or did not exist, when the change committed) gets nothing.
    -- A subscription's filter is checked on the row as sent (no row, for a
    -- table attached with include_row false, is {}), after the tenant scope and the
    -- attachment's excluded columns; only a filtered subscription's row is looked up
    -- (by primary key) for its filter, which is stored once per subscription.
    SELECT ch.event_id, se.subscription_id
      FROM changes ch
     CROSS JOIN LATERAL (
        SELECT se.subscription_id, se.active_since, se.filtered
          FROM webhooks.subscription_events se
         WHERE se.resource = ch.hook_resource AND se.event = ch.name AND se.tenant IS NULL
           AND ch.audience IS DISTINCT FROM 'tenanted'
        UNION ALL
        SELECT se.subscription_id, se.active_since, se.filtered
          FROM webhooks.subscription_events se
         WHERE se.resource = ch.hook_resource AND se.event = ch.name
           AND se.tenant = ch.tenant AND ch.tenant_scoped
           AND ch.audience IS DISTINCT FROM 'untenanted'
        UNION ALL
        SELECT se.subscription_id, se.active_since, se.filtered
          FROM webhooks.subscription_events se
         WHERE se.resource = ch.hook_resource AND se.event = ch.name
           AND se.tenant IS NOT NULL AND NOT ch.tenant_scoped
        OFFSET 0) se
     WHERE ch.problem IS NULL
       AND (ch.xid IS NULL OR NOT pg_visible_in_snapshot(ch.xid, se.active_since))
       AND (NOT se.filtered
            OR webhooks.filter_passes((SELECT s.filter_path FROM webhooks.subscriptions s
                                        WHERE s.id = se.subscription_id),
                                      ch.row_data, ch.changed))
), kept AS (
    INSERT INTO webhooks.events (id, hook_resource, name, tenant, occurred_at, body,
                                 traceparent, tracestate)
    SELECT ch.event_id, ch.hook_resource, ch.name, ch.tenant, ch.occurred_at,
           '{"event": '
           || webhooks.event_json(
                  ch.event_id, ch.name, ch.resource, ch.resource_id, ch.user_id,
                  ch.occurred_at,
                  CASE WHEN ch.parent_resource IS NOT NULL
                       THEN jsonb_build_object('resource', ch.parent_resource,
                                               'resource_id', ch.parent_id) END,
                  to_jsonb(ch.changed))
           -- The row (and the row before an update) in table order. One over the size
           -- limit is left out and flagged, rather than blocking the queue with a body no
           -- target would take.
           || webhooks.body_member('resource', r.json_text, %(max_row_bytes)s)
           || webhooks.body_member('previous', p.json_text, %(max_row_bytes)s)
           || '}',
           ch.traceparent, ch.tracestate
      FROM changes ch
     CROSS JOIN LATERAL webhooks.json_in_order(ch.row_json) r
     CROSS JOIN LATERAL webhooks.json_in_order(ch.previous_json) p
     WHERE ch.event_id IN (SELECT event_id FROM matched)
    RETURNING id, name, body, traceparent, tracestate
), leasable AS MATERIALIZED (
    -- The deliveries made leased (see the top): looked at only when the batch makes at
    -- most %(take)s and at most 64 deliveries, so a large fan-out never ranks its rows
    -- here, and the joins with this CTE below (which the generic plan may run as nested
    -- loops, every CTE estimated at one row) compare at most 64 by 64 rows.
    SELECT l.event_id, l.subscription_id, l.owner, l.target, l.secret, l.previous_secret
      FROM (SELECT m.*,
                   row_number() OVER (PARTITION BY m.owner ORDER BY m.event_id,
                                      m.subscription_id) + coalesce(o.n, 0) AS owner_slot
              FROM (SELECT m.event_id, m.subscription_id, s.owner, s.target, s.secret,
                           CASE WHEN s.previous_secret_expires_at > now()
                                THEN s.previous_secret END AS previous_secret,
                           row_number() OVER (PARTITION BY m.subscription_id
                                              ORDER BY m.event_id) + coalesce(b.n, 0) AS slot
                      FROM matched m
                      CROSS JOIN LATERAL (
                         SELECT s.owner, s.active, s.ordering, s.target, s.secret,
                                s.previous_secret, s.previous_secret_expires_at, s.rate_limit
                           FROM webhooks.subscriptions s
                          WHERE s.id = m.subscription_id LIMIT 1) s
                      LEFT JOIN busy b ON b.sid = m.subscription_id
                     WHERE (SELECT ok FROM quiet)
                       AND (SELECT count(*) FROM matched) <= least(%(take)s, 64)
                       -- A rate-limited subscription's deliveries go through the
                       -- claim, which spends its bucket.
                       AND s.active AND s.ordering = 'unordered' AND s.rate_limit IS NULL
                       AND m.subscription_id <> ALL (%(saturated)s::bigint[])
                       AND s.owner <> ALL (%(saturated_owners)s::text[])) m
              LEFT JOIN busy_owners o ON o.owner = m.owner
             WHERE m.slot <= CASE WHEN m.subscription_id = ANY (%(degraded)s::bigint[])
                                  THEN 1 ELSE %(per_target)s END) l
     WHERE l.owner_slot <= %(per_owner)s
), created AS (
    -- A strict subscription's delivery is parked (next_attempt_at 'infinity', out of the
    -- claim's due range: sql/ordering.sql) behind the batch's earlier one, or behind the
    -- subscription's pending head, which is locked so that a recorder finishing it
    -- unparks what this parks; a head locked by another transaction is not waited for:
    -- what comes after it is left due.
    -- Whether a subscription is strict is asked of subscriptions_strict_idx, which holds
    -- strict subscriptions only (an index-only probe that finds nothing for the others),
    -- not of each subscription's row; and the head is looked for inside the CASE, so only
    -- a strict subscription's first delivery of the batch runs that probe (as a lateral
    -- join it was set up for every delivery: a probe of each day's partition that found
    -- nothing). One change to 10,000 unordered subscriptions: 79 ms before, 61 ms.
    -- Every matched event is kept (kept inserts the changes matched names), so the
    -- deliveries come from matched alone: joined with kept, both estimated at one row in
    -- the generic plan, they became a nested loop comparing 9,500 by 9,500 rows (10.6 s).
    INSERT INTO webhooks.deliveries (event_id, subscription_id, next_attempt_at, attempts,
                                     lease_expires_at)
    SELECT m.event_id, m.subscription_id,
           CASE WHEN l.event_id IS NOT NULL THEN now() + make_interval(secs => %(lease)s)
                WHEN m.n IS NULL THEN now()  -- not strict
                WHEN m.n > 1 THEN 'infinity'::timestamptz
                -- A CASE branch, not an AND: an AND would run the probe for a NULL n too.
                -- From the queue's floor: one that was lowered since the worker read it
                -- may hide an older head, and the delivery is then left due, where the
                -- claim's own check holds it behind that head.
                ELSE CASE WHEN (SELECT true FROM webhooks.deliveries p
                                 WHERE p.subscription_id = m.subscription_id
                                   AND p.status = 'pending'
                                   AND p.created_at >= coalesce(%(since)s::timestamptz,
                                                                '-infinity')
                                 ORDER BY p.id LIMIT 1 FOR SHARE OF p SKIP LOCKED)
                          THEN 'infinity'::timestamptz ELSE now() END END,
           CASE WHEN l.event_id IS NOT NULL THEN 1 ELSE 0 END,
           CASE WHEN l.event_id IS NOT NULL THEN now() + make_interval(secs => %(lease)s) END
      FROM (SELECT m.*,
                   CASE WHEN (SELECT true FROM webhooks.subscriptions s
                               WHERE s.id = m.subscription_id AND s.ordering = 'strict')
                        THEN row_number() OVER (PARTITION BY m.subscription_id
                                                ORDER BY m.event_id) END AS n
              FROM matched m) m
      LEFT JOIN leasable l ON l.event_id = m.event_id AND l.subscription_id = m.subscription_id
     ORDER BY m.event_id, m.subscription_id
    RETURNING id, event_id, subscription_id, attempts, created_at
)
SELECT (SELECT ok FROM lock) AS locked,
       (SELECT count(*) FROM batch) AS taken,
       (SELECT count(*) FROM changes) AS changes,
       (SELECT count(*) FROM created) AS created,
       (SELECT count(*) FROM rejected) AS rejected,
       (SELECT ok FROM quiet) AS quiet,
       -- The leased deliveries, as the claim returns them (service.worker.delivery.Claim's
       -- fields, in its order), each a JSON array; NULL when none.
       (SELECT json_agg(json_build_array(c.id, c.attempts, c.subscription_id, l.owner, true,
                                         l.target, l.secret, k.name, k.body, now(),
                                         l.previous_secret, c.created_at, k.traceparent,
                                         k.tracestate) ORDER BY c.id)
          FROM (SELECT * FROM created c WHERE c.attempts = 1) c
          JOIN leasable l ON l.event_id = c.event_id AND l.subscription_id = c.subscription_id
          JOIN kept k ON k.id = c.event_id) AS claims

-- name: fanout_reject_first --
-- Last resort when even a careful fan-out of the first outbox row fails: that statement's
-- changes are set aside whole, with the error, so the rows behind it go on.
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(%(lock_key)s) AS ok
), first AS (
    DELETE FROM webhooks.outbox o
     WHERE o.id = (SELECT id FROM webhooks.outbox WHERE (SELECT ok FROM lock)
                    ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING o.*
)
INSERT INTO webhooks.rejected_changes (table_name, event, reason, row_text)
SELECT coalesce((SELECT a.table_oid::text FROM webhooks.attachments a
                  WHERE a.resource = f.resource), f.resource),
       f.name, %(reason)s, left(f.rows::text, 65536)
  FROM first f

-- name: fanout_end_stuck --
-- Ends the backend that holds the fan-out's lock while it waits for its client (idle in
-- its transaction, or in the middle of a pipeline or a result) in a transaction older than
-- %(stuck)s seconds: the connection of a worker killed or cut off behind a proxy that still
-- holds it open, which no worker's deadline ends (service.store.deadline ends those a live
-- worker abandoned), and which would stop every worker's fan-out. A fan-out that runs,
-- however long, does not wait for its client. Only the service role's own backends of
-- this database.
SELECT count(pg_terminate_backend(a.pid))::int AS ended
  FROM pg_locks l
  JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted
   AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
   AND l.classid = (%(lock_key)s::bigint >> 32)::oid
   AND l.objid = (%(lock_key)s::bigint & 4294967295)::oid
   AND l.objsubid = 1
   AND a.pid <> pg_backend_pid() AND a.usename = current_user
   AND a.xact_start < now() - make_interval(secs => %(stuck)s::float8)
   AND (a.state IN ('idle in transaction', 'idle in transaction (aborted)')
        OR a.wait_event IN ('ClientRead', 'ClientWrite'))
