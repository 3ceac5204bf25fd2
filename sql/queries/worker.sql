-- Queries of the delivery worker; loaded by service.db.queries().
-- Data flows one way: outbox -> events + deliveries (fan-out) -> claim -> record.

-- name: claim --
-- Claims up to %(limit)s due deliveries, oldest first, at most %(per_target)s minus what
-- this worker already has in flight per subscription (1 for the %(degraded)s ones, whose
-- last attempt failed: a hanging or failing target then holds one slot, not its full
-- share), and at most %(per_owner)s minus what it has in flight per owner (the owners'
-- counts come as %(owner_names)s / %(owner_counts)s), so one owner's many subscriptions
-- cannot fill the worker either. Subscriptions and owners already at their cap are
-- skipped in the scan, so one slow target or owner never blocks the queue of the others.
-- The claim pushes next_attempt_at to the lease expiry: if this worker dies, the delivery
-- comes due again by itself. Deliveries of an inactive subscription are closed as failed
-- instead of sent.
-- It runs on one generic plan per connection, which must be right whatever the
-- statistics said when it was built (QUEUE_SETTINGS in service/store/pool.py: sorts,
-- sequential and bitmap scans off): the due deliveries are read in order from the due
-- index, the chosen rows updated by row address in their own partition, and each one's
-- subscription and event found by one index probe.
-- The deliveries partitions before the queue's floor, %(since)s (sql/partitions.sql; NULL:
-- none known), hold nothing pending, and the bounds on created_at leave them out when the
-- plan starts, as the bound by now() leaves out the days ahead; a floor lowered since the
-- worker read it (`floor` below) claims nothing, and the worker reads it again (next_due).
WITH floor AS (
    SELECT %(since)s::timestamptz IS NULL
           OR %(since)s::timestamptz <= coalesce((SELECT f.since FROM webhooks.queue_floor f),
                                                 '-infinity') AS ok
), busy AS (
    SELECT sid, n FROM unnest(%(busy_ids)s::bigint[], %(busy_counts)s::int[]) AS b (sid, n)
), busy_owners AS (
    SELECT owner, n
      FROM unnest(%(owner_names)s::text[], %(owner_counts)s::int[]) AS b (owner, n)
), fifo AS (
    SELECT d.id, d.created_at, d.subscription_id, d.event_id, s.owner, d.next_attempt_at,
           d.tableoid AS part, d.ctid AS tid, false AS lane
      FROM webhooks.deliveries d
      JOIN webhooks.subscriptions s ON s.id = d.subscription_id
     WHERE d.status = 'pending'
       AND d.next_attempt_at <= now()
       AND d.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
       AND d.created_at <= now()
       AND (SELECT ok FROM floor)
       AND d.subscription_id <> ALL (%(saturated)s::bigint[])
       AND s.owner <> ALL (%(saturated_owners)s::text[])
       -- A strict subscription sends only its first pending delivery, in id order,
       -- which is event order: while one is in flight it is that first one (leased, not
       -- due), and a failing one holds the later ones until it succeeds or fails for
       -- good, across every worker. The ones behind it are parked out of the due range
       -- (sql/ordering.sql), so this probe runs for heads, not for a held queue. An
       -- inactive subscription's deliveries are all closed at once.
       AND (s.ordering = 'unordered' OR NOT s.active
            OR NOT EXISTS (SELECT 1 FROM webhooks.deliveries p
                            WHERE p.subscription_id = d.subscription_id
                              AND p.status = 'pending' AND p.id < d.id
                              AND p.created_at >= coalesce(%(since)s::timestamptz,
                                                           '-infinity')))
     ORDER BY d.next_attempt_at, d.id
     LIMIT %(scan)s
       FOR UPDATE OF d SKIP LOCKED
), others AS (
    -- The queues the worker's lane for other queues found (others_due below) and keeps
    -- while they have due deliveries: the oldest first would leave them behind a long
    -- queue of other subscriptions. Each one's first due deliveries (its start order),
    -- up to the room its cap leaves (one probe of each partition's pending index from its
    -- head's day, %(lane_since)s), checked again here as the oldest are.
    SELECT d.id, d.created_at, d.subscription_id, d.event_id, s.owner, d.next_attempt_at,
           d.part, d.tid, true AS lane
      FROM unnest(%(lane_sids)s::bigint[], %(lane_since)s::timestamptz[]) AS l (sid, since)
      JOIN webhooks.subscriptions s ON s.id = l.sid
      LEFT JOIN busy b ON b.sid = l.sid
     CROSS JOIN LATERAL (
        SELECT d.id, d.created_at, d.subscription_id, d.event_id, d.next_attempt_at,
               d.tableoid AS part, d.ctid AS tid
          FROM webhooks.deliveries d
         WHERE d.subscription_id = l.sid
           AND d.status = 'pending'
           AND d.next_attempt_at <= now()
           AND d.created_at >= l.since
           AND d.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
           AND d.created_at <= now()
           AND (s.ordering = 'unordered' OR NOT s.active
                OR NOT EXISTS (SELECT 1 FROM webhooks.deliveries p
                                WHERE p.subscription_id = d.subscription_id
                                  AND p.status = 'pending' AND p.id < d.id
                                  AND p.created_at >= coalesce(%(since)s::timestamptz,
                                                               '-infinity')))
         ORDER BY d.id
         -- Its room, and its share of the claim when the lane has several queues.
         LIMIT greatest(0, least(
                   CASE WHEN l.sid = ANY (%(degraded)s::bigint[]) THEN 1
                        ELSE %(per_target)s END - coalesce(b.n, 0),
                   (%(limit)s + cardinality(%(lane_sids)s::bigint[]) - 1)
                       / greatest(1, cardinality(%(lane_sids)s::bigint[]))))
           FOR UPDATE OF d SKIP LOCKED) d
     WHERE (SELECT ok FROM floor)
       AND l.sid <> ALL (%(saturated)s::bigint[])
       AND s.owner <> ALL (%(saturated_owners)s::text[])
       -- A queue the oldest-first scan reached is left to it: from both, the claim (which
       -- takes the lane's first) could start a later delivery and leave an earlier one.
       AND l.sid <> ALL (ARRAY(SELECT f.subscription_id FROM fifo f))
), candidates AS (
    SELECT * FROM fifo
    UNION ALL
    SELECT * FROM others
), limited AS MATERIALIZED (
    -- The buckets of the rate-limited subscriptions among the candidates (sql/ratelimit.sql),
    -- locked, so that every worker's claims spend one bucket in turn, refilled to now:
    -- what each may send now (`allowance`), and from when what it may not is spaced.
    SELECT b.subscription_id AS sid, b.rate, b.horizon,
           least(webhooks.rate_capacity(b.rate),
                 b.tokens + b.rate * extract(epoch FROM now() - b.at)) AS tokens
      FROM webhooks.rate_buckets b
     WHERE b.subscription_id = ANY (ARRAY(SELECT c.subscription_id FROM candidates c))
     ORDER BY b.subscription_id
       FOR UPDATE OF b
), per_subscription AS (
    SELECT c.id, c.created_at, c.subscription_id, c.event_id, c.owner, c.part, c.tid,
           c.lane, c.next_attempt_at AS due, l.rate, l.horizon,
           floor(l.tokens)::int AS allowance,
           row_number() OVER (PARTITION BY c.subscription_id
                              ORDER BY c.next_attempt_at, c.id) AS n,
           row_number() OVER (PARTITION BY c.subscription_id
                              ORDER BY c.next_attempt_at, c.id) + coalesce(b.n, 0) AS slot
      FROM candidates c
      LEFT JOIN busy b ON b.sid = c.subscription_id
      LEFT JOIN limited l ON l.sid = c.subscription_id
), deferred AS (
    -- A rate-limited subscription's due deliveries beyond what its bucket allows wait,
    -- each moved to its turn at the rate after the last one moved (the bucket's horizon):
    -- none is dropped or counted as an attempt, and the scan of the due index does not
    -- meet them again before their turn.
    UPDATE webhooks.deliveries d
       SET next_attempt_at = greatest(p.horizon, now())
                             + make_interval(secs => (p.n - p.allowance)::float8 / p.rate)
      FROM per_subscription p
     WHERE p.rate IS NOT NULL AND p.n > p.allowance
       AND d.ctid = p.tid AND d.tableoid = p.part AND d.created_at = p.created_at
       AND d.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
       AND d.created_at <= now()
    RETURNING d.subscription_id
), per_owner AS (
    SELECT p.id, p.created_at, p.subscription_id, p.event_id, p.part, p.tid, p.due, p.lane,
           row_number() OVER (PARTITION BY p.owner ORDER BY p.due, p.id)
               + coalesce(o.n, 0) AS slot
      FROM per_subscription p
      LEFT JOIN busy_owners o ON o.owner = p.owner
     WHERE p.slot <= CASE WHEN p.subscription_id = ANY (%(degraded)s::bigint[]) THEN 1
                          ELSE %(per_target)s END
       AND (p.rate IS NULL OR p.n <= p.allowance)
), chosen AS MATERIALIZED (
    SELECT c.id, c.created_at, c.subscription_id, c.part, c.tid, c.due, s.owner, s.active,
           s.target, s.secret, s.ordering = 'strict' AS strict, e.name, e.body,
           e.traceparent, e.tracestate,
           -- During a rotation's overlap the secret before it signs too.
           CASE WHEN s.previous_secret_expires_at > now() THEN s.previous_secret END
               AS previous_secret
      -- What the lane's queues have due first (queues the oldest-first scan does not
      -- reach), then the oldest.
      FROM (SELECT id, created_at, subscription_id, event_id, part, tid, due
              FROM per_owner
             WHERE slot <= %(per_owner)s
             ORDER BY lane DESC, due, id
             LIMIT %(limit)s) c
     CROSS JOIN LATERAL (
        SELECT s.owner, s.active, s.ordering, s.target, s.secret, s.previous_secret,
               s.previous_secret_expires_at
          FROM webhooks.subscriptions s WHERE s.id = c.subscription_id LIMIT 1) s
     -- The event is looked up newest partition first (its key is (id, created_at), so each
     -- partition's index gives that order and the Append stops at the first found): a
     -- due delivery's event is almost always in today's partition, and the oldest-first
     -- order probed every day kept before it (with 30 days of partitions, 21 us of each
     -- claimed delivery's 50).
     CROSS JOIN LATERAL (
        SELECT e.name, e.body, e.traceparent, e.tracestate
          FROM webhooks.events e WHERE e.id = c.event_id
         ORDER BY e.created_at DESC LIMIT 1) e
), spent AS (
    -- What the claim takes comes out of each bucket; the horizon moves past what waits.
    UPDATE webhooks.rate_buckets b
       SET tokens = l.tokens - coalesce((SELECT count(*) FROM chosen c
                                          WHERE c.subscription_id = l.sid AND c.active), 0),
           at = now(),
           horizon = CASE WHEN w.n > 0
                          THEN greatest(l.horizon, now())
                               + make_interval(secs => w.n::float8 / l.rate)
                          ELSE l.horizon END
      FROM limited l
     CROSS JOIN LATERAL (SELECT count(*) AS n FROM deferred x
                          WHERE x.subscription_id = l.sid) w
     WHERE b.subscription_id = l.sid
    RETURNING 1
)
UPDATE webhooks.deliveries d
   SET attempts = d.attempts + 1,
       next_attempt_at = CASE WHEN c.active THEN now() + make_interval(secs => %(lease)s)
                              ELSE d.next_attempt_at END,
       lease_expires_at = CASE WHEN c.active THEN now() + make_interval(secs => %(lease)s) END,
       status = CASE WHEN c.active THEN 'pending' ELSE 'failed' END,
       finished_at = CASE WHEN c.active THEN NULL ELSE now() END
  FROM chosen c
 -- The array gives each partition a TID scan whatever the join order (as the record's).
 WHERE d.ctid = ANY (ARRAY(SELECT t.tid FROM chosen t))
   AND d.created_at = c.created_at  -- the delivery's partition only
   -- The partitions the scans above read (the update of each one is set up at the start).
   AND d.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
   AND d.created_at <= now()
   AND d.tableoid = c.part AND d.ctid = c.tid
RETURNING d.id, d.attempts, d.subscription_id, c.owner, c.active, c.target, c.secret,
          c.name AS event, c.body, c.due, d.created_at, c.previous_secret, c.strict,
          c.traceparent, c.tracestate

-- name: others_due --
-- The worker's lane for the queues that the claim's oldest-first scan does not reach: the
-- claim reads the due index oldest first, so a fresh delivery waited behind every older
-- due delivery of another owner (200,000 of them: 41 s). Every LANE_EVERY while the
-- queue is busy, the worker walks the subscriptions that have pending deliveries, in id
-- order from %(after)s (one probe of the pending index per partition for each, which
-- finds its oldest pending delivery too; at most %(steps)s of them), and finds those
-- with a due delivery that it is not sending already (%(busy)s), %(take)s at most: the
-- worker's claims then take from their queues beside the oldest (the claim's `others`),
-- while they have due deliveries. Returns the last subscription walked (where the next
-- walk starts; 0 when this one reached the end) and, for each queue found, its owner and
-- its first due delivery's day (where the claim's probe of it starts).
-- It reads the partitions from the queue's floor, %(since)s (NULL: all of them), as the
-- claim does; a floor lowered since only hides a queue from this walk, which the claim's
-- oldest-first scan still reaches.
WITH RECURSIVE walk (sid, created_at, due, step) AS (
    -- Each step reads the first entry of the pending index after the last subscription:
    -- the next subscription and its oldest pending delivery, which is its head when due.
    (SELECT d.subscription_id, d.created_at, d.next_attempt_at <= now(), 1
       FROM webhooks.deliveries d
      WHERE d.status = 'pending' AND d.subscription_id > %(after)s
        AND d.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
      ORDER BY d.subscription_id, d.id LIMIT 1)
    UNION ALL
    SELECT n.subscription_id, n.created_at, n.next_attempt_at <= now(), w.step + 1
      FROM walk w
     CROSS JOIN LATERAL (
        SELECT d.subscription_id, d.created_at, d.next_attempt_at
          FROM webhooks.deliveries d
         WHERE d.status = 'pending' AND d.subscription_id > w.sid
           AND d.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
         ORDER BY d.subscription_id, d.id LIMIT 1) n
     WHERE w.step < %(steps)s
), heads AS (
    -- The subscriptions this worker is sending already (the saturated ones among them)
    -- are left to it: no head, no probe.
    SELECT w.sid, w.created_at
      FROM walk w
     WHERE w.due AND w.sid <> ALL (%(busy)s::bigint[])
    UNION ALL
    -- The oldest is in flight or waits for a retry: the first due one after it.
    SELECT w.sid, h.created_at
      FROM walk w
     CROSS JOIN LATERAL (
        SELECT d.created_at FROM webhooks.deliveries d
         WHERE d.subscription_id = w.sid AND d.status = 'pending'
           AND d.next_attempt_at <= now()
           AND d.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
           AND d.created_at <= now()
         ORDER BY d.id LIMIT 1) h
     WHERE NOT w.due AND w.sid <> ALL (%(busy)s::bigint[])
), taken AS MATERIALIZED (
    -- At most %(take)s queues, one per owner first (each costs the claim a probe; a walk
    -- over 256 subscriptions of a few owners gives each of them a turn).
    SELECT h.sid, h.owner, h.created_at, h.turn
      FROM (SELECT h.sid, s.owner, h.created_at,
                   row_number() OVER (PARTITION BY s.owner ORDER BY h.sid) AS turn
              FROM heads h
              JOIN webhooks.subscriptions s ON s.id = h.sid) h
     ORDER BY h.turn, h.sid
     LIMIT %(take)s
)
SELECT CASE WHEN (SELECT count(*) FROM walk) >= %(steps)s
            THEN (SELECT max(w.sid) FROM walk w) ELSE 0 END AS last,
       ARRAY(SELECT t.sid FROM taken t ORDER BY t.turn, t.sid) AS sids,
       ARRAY(SELECT t.owner FROM taken t ORDER BY t.turn, t.sid) AS owners,
       ARRAY(SELECT t.created_at FROM taken t ORDER BY t.turn, t.sid) AS created

-- name: next_due --
-- Seconds until the earliest pending delivery of a subscription and owner not at their
-- caps comes due (negative when one is due now), or NULL when none is pending.
-- Parked deliveries (strict ordering's, next_attempt_at 'infinity') are not waited for.
-- It looks at every partition, and returns the queue's floor (sql/partitions.sql; NULL
-- when there is none) for the claims after it.
SELECT extract(epoch FROM min(d.next_attempt_at) - now())::float8 AS wait,
       (SELECT nullif(f.since, '-infinity') FROM webhooks.queue_floor f) AS since
  FROM webhooks.deliveries d
 WHERE d.status = 'pending' AND d.next_attempt_at < 'infinity'
   AND d.subscription_id <> ALL (%(saturated)s::bigint[])
   AND (cardinality(%(saturated_owners)s::text[]) = 0
        OR NOT EXISTS (SELECT 1 FROM webhooks.subscriptions s
                        WHERE s.id = d.subscription_id
                          AND s.owner = ANY (%(saturated_owners)s::text[])))

-- name: record --
-- Records a batch of finished attempts in one statement: the deliveries' new state, one
-- attempts row each, and the subscriptions' last_* fields (from the latest attempt of each
-- subscription in the batch), with failing_since and recovered_at, which
-- webhooks.lifecycle() turns into operational events (sql/lifecycle.sql). A delivery whose claim this worker no longer holds (its
-- lease expired and another worker claimed it: attempts moved on) is left alone.
-- The batch comes as one JSON array of [id, attempt, subscription_id, status, outcome,
-- retry_in, attempted_at (epoch seconds), duration_ms, error, the delivery's created_at
-- (its partition key, as text: exact to the microsecond)]: one parameter that Python
-- encodes in C, where ten typed arrays cost a Python call per element. Runs on the
-- worker's queue pool, like the claim (QUEUE_SETTINGS in service/store/pool.py).
WITH r AS (
    SELECT (a ->> 0)::bigint AS id, (a ->> 1)::int AS attempt,
           (a ->> 2)::bigint AS subscription_id, (a ->> 3)::int AS status,
           a ->> 4 AS outcome, (a ->> 5)::float8 AS retry_in,
           to_timestamp((a ->> 6)::float8) AS attempted_at, (a ->> 7)::float8 AS duration_ms,
           a ->> 8 AS error, a ->> 8 AS content, (a ->> 9)::timestamptz AS created_at
      FROM jsonb_array_elements(%(batch)s::jsonb) AS a
), found AS MATERIALIZED (
    -- Each outcome's delivery, found by one primary-key probe of its own partition
    -- (LIMIT 1 keeps it a per-row probe whatever the statistics say: a join could read
    -- every pending delivery of the queue, once per outcome). One probe serves both the
    -- update (by row address: a TID scan, never a join with the queue) and the attempt
    -- log (a deleted delivery gets no attempt row).
    -- Each outcome's subscription is locked before its delivery is touched (the batch
    -- comes sorted by subscription, so the locks are taken in id order). Deleting a
    -- subscription (the API, a DBA) locks it and then deletes its deliveries
    -- (webhooks.forget_deliveries): taken the other way round, the two statements
    -- deadlocked, and one of them failed (the DELETE, when it had waited first). A
    -- subscription deleted meanwhile is not locked but left out, its outcomes with it:
    -- its deliveries went with it.
    SELECT r.*, x.tableoid AS part, x.ctid AS tid, l.strict
      FROM r
     CROSS JOIN LATERAL (
        SELECT s.id, s.ordering = 'strict' AS strict FROM webhooks.subscriptions s
         WHERE s.id = r.subscription_id
           FOR NO KEY UPDATE OF s) AS l
     CROSS JOIN LATERAL (
        SELECT d.tableoid, d.ctid FROM webhooks.deliveries d
         WHERE d.id = r.id AND d.created_at = r.created_at
         LIMIT 1) AS x
), done AS (
    UPDATE webhooks.deliveries d
       SET status = r.outcome,
           next_attempt_at = CASE WHEN r.outcome = 'pending'
                                  THEN now() + make_interval(secs => r.retry_in)
                                  ELSE d.next_attempt_at END,
           lease_expires_at = NULL,
           finished_at = CASE WHEN r.outcome = 'pending' THEN NULL ELSE now() END
      FROM found r
     WHERE d.ctid = ANY (ARRAY(SELECT f.tid FROM found f))
       AND d.tableoid = r.part AND d.ctid = r.tid
       AND d.attempts = r.attempt AND d.status = 'pending'
    RETURNING d.id
), logged AS (
    INSERT INTO webhooks.attempts (delivery_id, subscription_id, attempt, attempted_at,
                                   status, duration_ms, error)
    SELECT r.id, r.subscription_id, r.attempt, r.attempted_at, r.status, r.duration_ms,
           r.error
      FROM found r
    RETURNING 1
), latest AS (
    SELECT r.subscription_id,
           (array_agg(r.status ORDER BY r.attempted_at DESC))[1] AS last_status,
           max(r.attempted_at) FILTER (WHERE r.outcome = 'succeeded') AS success_at,
           max(r.attempted_at) FILTER (WHERE r.outcome <> 'succeeded') AS failure_at,
           (array_agg(r.content ORDER BY r.attempted_at DESC)
              FILTER (WHERE r.outcome <> 'succeeded'))[1] AS failure_content,
           bool_or(r.status = 410) AS gone
      FROM r
     GROUP BY r.subscription_id
), first_failure AS (
    -- The first failure of the batch after its last success (its first failure, when it
    -- has no success): where a failure episode starts, unless one is already under way.
    SELECT r.subscription_id, min(r.attempted_at) AS since
      FROM r
      JOIN latest l ON l.subscription_id = r.subscription_id
     WHERE r.outcome <> 'succeeded'
       AND (l.success_at IS NULL OR r.attempted_at > l.success_at)
     GROUP BY r.subscription_id
), subs AS (
    -- A subscription disabled automatically keeps its lifecycle (and the reason in
    -- last_failure_content) whatever attempts in flight then come back with.
    UPDATE webhooks.subscriptions s
       SET last_status = l.last_status,
           last_success_at = greatest(s.last_success_at, l.success_at),
           last_failure_at = greatest(s.last_failure_at, l.failure_at),
           last_failure_content = CASE WHEN s.disabled_at IS NOT NULL
                                       THEN s.last_failure_content
                                       WHEN l.failure_at IS NOT NULL THEN l.failure_content
                                       ELSE s.last_failure_content END,
           failing_since = CASE WHEN s.disabled_at IS NOT NULL THEN s.failing_since
                                WHEN f.since IS NULL THEN NULL
                                WHEN l.success_at IS NULL
                                THEN coalesce(s.failing_since, f.since)
                                ELSE f.since END,
           failing_notified_at = CASE WHEN s.disabled_at IS NULL AND l.success_at IS NOT NULL
                                      THEN NULL ELSE s.failing_notified_at END,
           recovered_at = CASE WHEN s.disabled_at IS NULL AND l.success_at IS NOT NULL
                                    AND s.failing_notified_at IS NOT NULL
                               THEN coalesce(s.recovered_at, l.success_at)
                               ELSE s.recovered_at END,
           active = s.active AND NOT l.gone
      FROM latest l
      LEFT JOIN first_failure f ON f.subscription_id = l.subscription_id
     WHERE s.id = l.subscription_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM done) AS updated,
       (SELECT count(*) FROM logged) AS logged,
       (SELECT count(*) FROM subs) AS subscriptions,
       -- The strict subscriptions whose head finished: the recorder unparks their next
       -- delivery (`unpark`, a later statement, which sees what parkers committed while
       -- this one waited for the head's lock: sql/ordering.sql).
       ARRAY(SELECT DISTINCT f.subscription_id FROM found f
              WHERE f.strict AND f.outcome <> 'pending') AS finished_strict

-- name: unpark --
-- The next delivery of each of these strict subscriptions comes due (sql/ordering.sql).
SELECT webhooks.unpark(%(subscription_ids)s::bigint[]) AS unparked

-- name: stop_gone --
-- A target answered 410 Gone: its subscription is inactive now, and what was still
-- queued for it will never be sent.
UPDATE webhooks.deliveries
   SET status = 'failed', finished_at = now(), lease_expires_at = NULL
 WHERE subscription_id = ANY (%(subscription_ids)s::bigint[])
   AND status = 'pending'

-- name: close_inactive --
-- Closes as failed, at once, up to %(limit)s due deliveries of these subscriptions that are
-- still inactive; the claim returned some of theirs closed. A subscription paused over the
-- API, detached, or whose table was dropped keeps its pending deliveries, and the claim
-- closes what it meets of them within its caps, oldest first: a large queue of one
-- stood before every other subscription's for as long as the claims took to reach its
-- end (20,000 held another owner's fresh delivery for 107-168 s). Rows another
-- transaction holds (a claim, the subscription's DELETE) are skipped, never waited for;
-- not-yet-due retries wait for their time, as before. No attempt is counted: nothing was
-- sent. The rows are found by the pending index and updated by address, as the claim's.
WITH x AS MATERIALIZED (
    SELECT p.tableoid AS part, p.ctid AS tid, p.created_at
      FROM webhooks.subscriptions s
      JOIN webhooks.deliveries p ON p.subscription_id = s.id
     WHERE s.id = ANY (%(subscription_ids)s::bigint[]) AND NOT s.active
       AND p.status = 'pending' AND p.next_attempt_at <= now()
     LIMIT %(limit)s
       FOR UPDATE OF p SKIP LOCKED
)
UPDATE webhooks.deliveries d
   SET status = 'failed', finished_at = now(), lease_expires_at = NULL
  FROM x
 WHERE d.ctid = ANY (ARRAY(SELECT t.tid FROM x t))
   AND d.created_at = x.created_at AND d.tableoid = x.part AND d.ctid = x.tid

-- name: release --
-- Claims this worker will not finish (at shutdown, or waiting behind a target that became
-- degraded) come due again at once, in their place: at the time they were due when
-- claimed, so that a queue's later deliveries do not pass them. The attempt they did not
-- complete is given back.
UPDATE webhooks.deliveries d
   SET next_attempt_at = least(r.due, now()), lease_expires_at = NULL,
       attempts = d.attempts - 1
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(dues)s::timestamptz[])
       AS r (id, attempt, due)
 WHERE d.id = r.id AND d.attempts = r.attempt AND d.status = 'pending'

-- name: partitions_ensure --
-- Retention (sql/partitions.sql): the daily partitions from today to %(ahead)s days ahead.
SELECT webhooks.ensure_partitions(now(), now() + make_interval(days => %(ahead)s)) AS created

-- name: partitions_close_orphans --
SELECT webhooks.close_orphans() AS closed

-- name: partitions_expired --
-- Bounds as epoch seconds in numeric's text (exact to the microsecond, 'Infinity' for
-- MINVALUE/MAXVALUE, which Python datetimes cannot hold): they go back to
-- webhooks.keep_detached_deliveries as they came, and no session setting (DateStyle,
-- TimeZone) touches their text.
SELECT parent, partition, extract(epoch FROM lower_bound)::text AS lower_bound,
       extract(epoch FROM upper_bound)::text AS upper_bound, detach_pending
  FROM webhooks.expired_partitions(make_interval(secs => %(retention)s))

-- name: partitions_keep_detached --
-- The bounds back from epoch seconds, exactly: whole microseconds from the epoch (a
-- float8 of the seconds, as to_timestamp takes, misses some by one).
SELECT webhooks.keep_detached_deliveries(
           %(partition)s,
           CASE %(lower_bound)s::numeric WHEN '-Infinity' THEN '-infinity'::timestamptz
                ELSE to_timestamp(0) + (%(lower_bound)s::numeric * 1000000)::bigint
                                       * interval '1 microsecond' END,
           CASE %(upper_bound)s::numeric WHEN 'Infinity' THEN 'infinity'::timestamptz
                ELSE to_timestamp(0) + (%(upper_bound)s::numeric * 1000000)::bigint
                                       * interval '1 microsecond' END,
           make_interval(secs => %(retention)s)) AS kept

-- name: partitions_lock --
-- One pruner at a time: DETACH ... CONCURRENTLY runs one per table at a time anyway.
SELECT pg_try_advisory_lock(%(key)s) AS locked

-- name: partitions_unlock --
SELECT pg_advisory_unlock(%(key)s)

-- name: current_partitions --
-- The deliveries partitions being filled (today's, and the day before's for an hour after
-- midnight). The worker analyses them after a burst has made many deliveries since
-- autovacuum last looked, so that plans made for what the statistics say (the API's
-- delivery log, next_due, the status counts) know the due deliveries are many (the
-- worker's queue statements hold whatever the statistics: QUEUE_SETTINGS); and vacuums
-- them once a backlog is drained. A role that does not own them is told so in a warning,
-- not an error.
SELECT partition FROM webhooks.queue_partitions
 WHERE parent = 'deliveries' AND upper_bound > now() - interval '1 hour'
   AND lower_bound <= now()
 ORDER BY lower_bound

-- name: listen --
LISTEN webhooks

-- name: wakeup_arm --
-- This worker waits: writers' triggers send NOTIFY while a row exists. Rows of
-- connections that no longer exist (a killed worker, a restart) are removed on the way.
WITH gone AS (
    DELETE FROM webhooks.wakeups w
     WHERE w.pid = %(old_pid)s
        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid)
)
INSERT INTO webhooks.wakeups (pid) VALUES (%(pid)s)
ON CONFLICT (pid) DO UPDATE SET armed_at = now()

-- name: wakeup_disarm --
DELETE FROM webhooks.wakeups WHERE pid = %(pid)s

-- name: task_crashed --
-- One of this worker's background tasks crashed and is being restarted (sql/health.sql).
INSERT INTO webhooks.worker_tasks (worker, task, restarts, last_error, last_crash_at)
VALUES (%(worker)s, %(task)s, %(restarts)s, %(error)s, now())
ON CONFLICT (worker, task) DO UPDATE
   SET restarts = EXCLUDED.restarts, last_error = EXCLUDED.last_error,
       last_crash_at = EXCLUDED.last_crash_at

-- name: prune_worker_tasks --
-- Retention: crash records of tasks that have not crashed for a long time.
DELETE FROM webhooks.worker_tasks
 WHERE last_crash_at < now() - make_interval(secs => %(retention)s)

-- name: lifecycle --
-- One round of operational events and auto-disable (webhooks.lifecycle in
-- sql/lifecycle.sql); a disable_after of 0 turns auto-disable off.
SELECT subscription_id, owner, event, since, queued
  FROM webhooks.lifecycle(make_interval(secs => %(failing_after)s),
                          make_interval(secs => %(disable_after)s))

-- name: refresh_queue_floor --
-- Raises the queue's floor to what is pending now (sql/partitions.sql), every few seconds
-- beside the lifecycle round; the claims after it pass it as their `since`.
SELECT nullif(webhooks.refresh_queue_floor(), '-infinity') AS since
