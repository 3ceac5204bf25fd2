-- Queries of the delivery log, redelivery, recovery and test events;
-- used by the REST API (service/api/deliveries.py) and the CLI
-- (service/commands/deliveries.py). The API scopes by owner and tenant with
-- deliveries_subscription first; the CLI, an operator's tool, sees every subscription.

-- name: deliveries_subscription --
-- The subscription, if the caller may see it (another owner's or tenant's id is unknown).
SELECT id, active
  FROM webhooks.subscriptions
 WHERE id = %(id)s AND owner = %(owner)s
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)

-- name: deliveries_subscription_any --
SELECT id, active FROM webhooks.subscriptions WHERE id = %(id)s

-- name: deliveries_list --
-- One page of a subscription's deliveries, newest first (created_at, then id), after the
-- delivery `before` (the cursor: older than it). A backward range scan of
-- deliveries_log_idx (subscription_id, created_at, id), bounded by the cursor, since and
-- until, that stops after `limit` rows, however many deliveries the subscription has; the
-- status and event filters are checked on the rows scanned. A cursor that names no
-- delivery of the subscription (pruned meanwhile) ends the list rather than restarting it.
-- next_attempt_at is shown only while pending and due at some time (null while a strict
-- subscription's delivery waits behind an earlier one); last_status is the latest attempt's.
SELECT d.id, e.name AS event, d.event_id, d.status, d.attempts, d.created_at,
       CASE WHEN d.status = 'pending' AND d.next_attempt_at < 'infinity'
            THEN d.next_attempt_at END AS next_attempt_at,
       d.finished_at,
       (SELECT a.status FROM webhooks.attempts a
         WHERE a.delivery_id = d.id ORDER BY a.id DESC LIMIT 1) AS last_status
  FROM webhooks.deliveries d
 -- Each delivery's event from the newest day back, stopping at the day that has it (a
 -- join probed every day kept, for each row of the page).
 CROSS JOIN LATERAL (
    SELECT e.name FROM webhooks.events e WHERE e.id = d.event_id
     ORDER BY e.created_at DESC LIMIT 1) e
 WHERE d.subscription_id = %(subscription_id)s
   AND (d.created_at, d.id) < (
           coalesce((SELECT c.created_at FROM webhooks.deliveries c
                      WHERE c.id = %(before)s::bigint
                        AND c.subscription_id = %(subscription_id)s),
                    CASE WHEN %(before)s::bigint IS NULL THEN 'infinity'::timestamptz
                         ELSE '-infinity'::timestamptz END),
           coalesce(%(before)s::bigint, 9223372036854775807))
   AND (%(status)s::text IS NULL OR d.status = %(status)s::text)
   AND (%(event)s::text IS NULL OR e.name = %(event)s::text)
   AND d.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
   AND d.created_at < coalesce(%(until)s::timestamptz, 'infinity')
 ORDER BY d.created_at DESC, d.id DESC
 LIMIT %(limit)s

-- name: deliveries_get --
-- One delivery (of the given subscription, unless subscription_id is NULL) with the body
-- as sent.
SELECT d.id, e.name AS event, d.event_id, d.status, d.attempts, d.created_at,
       CASE WHEN d.status = 'pending' AND d.next_attempt_at < 'infinity'
            THEN d.next_attempt_at END AS next_attempt_at,
       d.finished_at,
       (SELECT a.status FROM webhooks.attempts a
         WHERE a.delivery_id = d.id ORDER BY a.id DESC LIMIT 1) AS last_status,
       d.subscription_id, e.body
  FROM webhooks.deliveries d
 CROSS JOIN LATERAL (
    SELECT e.name, e.body FROM webhooks.events e WHERE e.id = d.event_id
     ORDER BY e.created_at DESC LIMIT 1) e
 WHERE d.id = %(id)s
   AND (%(subscription_id)s::bigint IS NULL OR d.subscription_id = %(subscription_id)s::bigint)

-- name: deliveries_attempts --
-- Every attempt of a delivery, oldest first.
SELECT attempt, attempted_at, status, duration_ms, error
  FROM webhooks.attempts
 WHERE delivery_id = %(id)s
 ORDER BY attempted_at, id

-- name: deliveries_redeliver --
-- sql/recovery.sql: P0002 unknown delivery, 55000 inactive subscription.
SELECT webhooks.redeliver(%(id)s) AS id

-- name: deliveries_recover --
-- sql/recovery.sql: P0002 unknown subscription, 55000 inactive subscription.
SELECT webhooks.recover(%(subscription_id)s, %(since)s, %(until)s) AS requeued

-- name: deliveries_test --
-- A `webhook.test` event for one active subscription (whatever its events), with the body
-- built by webhooks.event_body, as fan-out builds bodies, and no `resource`
-- member, and one delivery to that subscription only. No row when the subscription is
-- unknown or inactive. A waiting worker is woken (the conditional NOTIFY).
WITH s AS (
    SELECT id, owner, tenant FROM webhooks.subscriptions
     WHERE id = %(id)s AND active
       FOR SHARE
), ev AS (
    INSERT INTO webhooks.events (id, hook_resource, name, tenant, occurred_at, body)
    SELECT x.event_id, 'webhooks', 'webhook.test', s.tenant, x.at,
           webhooks.event_body(x.event_id, 'webhook.test', 'webhooks', to_jsonb(s.id),
                               s.owner, x.at)
      FROM s
     CROSS JOIN LATERAL (SELECT nextval('webhooks.event_ids'::regclass) AS event_id,
                                now() AS at) x
    RETURNING id
), created AS (
    INSERT INTO webhooks.deliveries (event_id, subscription_id)
    SELECT ev.id, s.id FROM ev, s
    RETURNING id
), woken AS (
    SELECT pg_notify('webhooks', '') FROM webhooks.wakeups
     WHERE EXISTS (SELECT 1 FROM created)
     LIMIT 1
)
SELECT created.id, (SELECT count(*) FROM woken) AS woken FROM created

-- name: deliveries_stats --
-- A subscription's attempts per hour over the last %(hours)s hours, every hour present
-- (zeros included): answered 2xx, answered otherwise, no answer. The subscription's
-- deliveries are found by the log's index (created up to two days before the window,
-- the longest retry schedule's reach), their attempts by delivery; only the window's
-- attempts partitions are read.
WITH hours AS (
    SELECT h FROM generate_series(date_trunc('hour', now()) - make_interval(hours => %(hours)s - 1),
                                  date_trunc('hour', now()), interval '1 hour') AS h
), tried AS (
    SELECT date_trunc('hour', a.attempted_at) AS h, a.status
      FROM webhooks.deliveries d
      JOIN webhooks.attempts a ON a.delivery_id = d.id
     WHERE d.subscription_id = %(id)s
       AND d.created_at >= date_trunc('hour', now()) - make_interval(hours => %(hours)s + 47)
       AND a.attempted_at >= date_trunc('hour', now()) - make_interval(hours => %(hours)s - 1)
)
SELECT to_char(hours.h AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:00:00"Z"') AS hour,
       count(t.status) FILTER (WHERE t.status BETWEEN 200 AND 299) AS succeeded,
       count(t.status) FILTER (WHERE t.status <> 0 AND t.status NOT BETWEEN 200 AND 299)
           AS failed,
       count(t.status) FILTER (WHERE t.status = 0) AS unanswered
  FROM hours LEFT JOIN tried t ON t.h = hours.h
 GROUP BY hours.h
 ORDER BY hours.h
