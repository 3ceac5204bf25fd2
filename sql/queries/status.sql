-- Queries of `webhooks status`; loaded by service.db.queries().

-- name: status_attachments --
SELECT a.table_oid::text AS "table", a.resource, a.hook_resource, a.noun,
       a.include_row, a.public, a.tenant_column, a.include_previous AND a.include_row
           AS include_previous,
       (SELECT count(*) FROM webhooks.subscriptions s
         WHERE s.active AND s.resource = a.hook_resource
           AND s.events && ARRAY[a.noun || '.create', a.noun || '.update',
                                 a.noun || '.delete', a.noun || '.truncate']) AS subscriptions
  FROM webhooks.attachments a
 ORDER BY a.hook_resource, a.resource

-- name: status_subscriptions --
SELECT count(*) FILTER (WHERE active) AS active,
       count(*) FILTER (WHERE NOT active) AS inactive,
       count(*) FILTER (WHERE active AND last_failure_at IS NOT NULL
                        AND (last_success_at IS NULL OR last_failure_at > last_success_at))
           AS failing,
       count(*) FILTER (WHERE active AND filter IS NOT NULL) AS filtered,
       count(*) FILTER (WHERE active AND ordering = 'strict') AS strict
  FROM webhooks.subscriptions

-- name: status_partitions --
-- The queue tables' daily partitions (sql/partitions.sql): how many, the oldest day kept
-- and how far ahead they are made.
SELECT parent, count(*) AS partitions,
       min(lower_bound)::text AS oldest, max(upper_bound)::text AS ahead_until
  FROM webhooks.queue_partitions
 GROUP BY parent
 ORDER BY parent

-- name: status_deliveries --
SELECT count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'pending' AND next_attempt_at <= now()) AS due,
       count(*) FILTER (WHERE status = 'pending' AND attempts > 0) AS retrying,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'pending'))
           AS oldest_pending_seconds
  FROM webhooks.deliveries

-- name: status_attempts --
SELECT count(*) AS attempts,
       count(*) FILTER (WHERE status NOT BETWEEN 200 AND 299) AS failures
  FROM webhooks.attempts
 WHERE attempted_at > now() - interval '1 hour'

-- name: status_failing --
SELECT s.id, s.target, s.last_status, count(*) AS failures,
       left(s.last_failure_content, 80) AS last_failure
  FROM webhooks.attempts t
  JOIN webhooks.subscriptions s ON s.id = t.subscription_id
 WHERE t.attempted_at > now() - interval '1 hour'
   AND t.status NOT BETWEEN 200 AND 299
 GROUP BY s.id
 ORDER BY count(*) DESC, s.id
 LIMIT 5

-- name: status_lifecycle_counts --
-- The failure lifecycle (sql/lifecycle.sql): active subscriptions failing since their last
-- success, of which webhook.failing was sent for how many, and those disabled
-- automatically (and not re-activated since).
SELECT count(*) FILTER (WHERE active AND failing_since IS NOT NULL) AS failing,
       count(*) FILTER (WHERE active AND failing_notified_at IS NOT NULL) AS notified,
       count(*) FILTER (WHERE NOT active AND disabled_at IS NOT NULL) AS disabled
  FROM webhooks.subscriptions

-- name: status_lifecycle --
-- The subscriptions behind those counts: disabled ones latest first, then the failing ones
-- longest first.
SELECT s.id, s.owner, s.target, s.active, s.failing_since, s.disabled_at,
       s.failing_notified_at IS NOT NULL AS notified,
       extract(epoch FROM now() - s.failing_since)::float8 AS failing_seconds,
       left(s.last_failure_content, 120) AS last_failure
  FROM webhooks.subscriptions s
 WHERE (s.active AND s.failing_since IS NOT NULL)
    OR (NOT s.active AND s.disabled_at IS NOT NULL)
 ORDER BY s.disabled_at DESC NULLS LAST, s.failing_since, s.id
 LIMIT 20

-- name: status_stopped --
-- Subscriptions the service made inactive for a reason of the registry (their table
-- detached or dropped, their events made private), latest first; those disabled
-- automatically are listed with the failure lifecycle.
SELECT s.id, s.owner, s.resource, s.target, s.inactive_reason
  FROM webhooks.subscriptions s
 WHERE NOT s.active AND s.inactive_reason IS NOT NULL AND s.disabled_at IS NULL
 ORDER BY s.id DESC
 LIMIT 20

-- name: status_outbox --
-- Counting the changes parses every pending statement's JSON: fine for an operator's
-- command, too slow for the metrics loop (which counts statements).
SELECT coalesce(sum(json_array_length(rows)), 0) AS events,
       count(*) AS statements,
       extract(epoch FROM now() - min(occurred_at)) AS oldest_seconds
  FROM webhooks.outbox

-- name: status_worker_tasks --
-- Workers' background tasks that crashed (and were restarted) in the last day, latest
-- first; the table comes from sql/health.sql (checked for before this runs).
SELECT worker, task, restarts, left(last_error, 200) AS last_error, last_crash_at,
       extract(epoch FROM now() - last_crash_at)::float8 AS seconds_ago
  FROM webhooks.worker_tasks
 WHERE last_crash_at > now() - interval '1 day'
 ORDER BY last_crash_at DESC, worker, task
 LIMIT 10

-- name: status_rejected --
-- Changes fan-out set aside (a row that cannot become an event): how many, and the
-- latest five. Always one row at least: `total` with NULLs when there are none.
SELECT t.total, r.table_name, r.event, r.reason, r.set_aside_at
  FROM (SELECT count(*) AS total FROM webhooks.rejected_changes) t
  LEFT JOIN LATERAL (
        SELECT c.table_name, c.event, left(c.reason, 200) AS reason, c.set_aside_at
          FROM webhooks.rejected_changes c
         ORDER BY c.set_aside_at DESC, c.id DESC
         LIMIT 5) r ON true
 ORDER BY r.set_aside_at DESC NULLS LAST

-- name: metrics_gauges --
SELECT (SELECT count(*) FROM webhooks.deliveries
         WHERE status = 'pending' AND next_attempt_at <= now()) AS due,
       (SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)
          FROM webhooks.deliveries WHERE status = 'pending') AS oldest_pending_seconds,
       (SELECT count(*) FROM webhooks.outbox) AS outbox_statements,
       (SELECT coalesce(extract(epoch FROM now() - min(occurred_at)), 0)
          FROM webhooks.outbox) AS outbox_lag_seconds

-- name: work_due --
-- Whether a worker has work to do: a captured statement waiting for fan-out, or a
-- delivery due. The worker's liveness check asks it once the worker made no progress
-- for WEBHOOKS_LIVENESS_TIMEOUT (service/worker/liveness.py).
SELECT EXISTS (SELECT 1 FROM webhooks.outbox)
       OR EXISTS (SELECT 1 FROM webhooks.deliveries
                   WHERE status = 'pending' AND next_attempt_at <= now()) AS due

-- name: status_workers --
-- The workers' LISTEN connections, and what each one's last proof of life reported (its
-- last statement, `SELECT '<json>' AS webhooks_progress`: service/worker/listener.py).
-- Another role's connections show their text only to members of pg_read_all_stats.
SELECT a.pid, a.backend_start, a.query_start AS proved_at, a.state,
       extract(epoch FROM now() - a.query_start)::float8 AS proved_seconds_ago,
       a.query
  FROM pg_catalog.pg_stat_activity a
 WHERE a.application_name = 'webhooks-listener'
   AND a.datname = pg_catalog.current_database()
 ORDER BY a.backend_start, a.pid
