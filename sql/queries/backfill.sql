-- Backfill (sql/backfill.sql): the REST API starts backfills and shows
-- their progress (service/api/backfills.py), the workers run them a batch at a time
-- (service/worker/backfill.py), `webhooks status` lists the running and failed ones.

-- name: backfill_start --
-- sql/backfill.sql: P0002 unknown subscription, 55000 inactive, 55006 one is running,
-- 22023 nothing to backfill or a table that cannot be, 54000 the owner runs as many
-- backfills as it may.
SELECT webhooks.start_backfill(%(subscription_id)s, %(max_per_owner)s) AS id

-- name: backfill_check_tables --
-- sql/backfill.sql: forgets the subscription's tables that are no longer ordinary tables
-- with their key; the first reason, or NULL.
SELECT webhooks.check_backfill_tables(%(subscription_id)s) AS problem

-- name: backfill_get --
-- One backfill of the subscription, as the API shows it.
SELECT webhooks.backfill_json(b)::text AS body
  FROM webhooks.backfills b
 WHERE b.id = %(id)s AND b.subscription_id = %(subscription_id)s

-- name: backfill_list --
-- The subscription's backfills, newest first.
SELECT webhooks.backfill_json(b)::text AS body
  FROM webhooks.backfills b
 WHERE b.subscription_id = %(subscription_id)s
 ORDER BY b.id DESC
 LIMIT %(limit)s

-- name: backfill_step --
-- One batch of a running backfill (no row when none is ready), in the caller's
-- transaction: its deliveries and its cursor commit together.
SELECT backfill_id, subscription_id, status, rows, queued
  FROM webhooks.backfill_step(%(batch_size)s, %(max_row_bytes)s, %(ahead)s)

-- name: status_backfills --
-- Running backfills, and those that failed in the last day, latest first.
SELECT b.id, b.subscription_id, b.status, b.rows, b.batches, b.created_at, b.updated_at,
       b.finished_at, left(b.error, 200) AS error,
       extract(epoch FROM now() - b.updated_at)::float8 AS idle_seconds,
       (SELECT string_agg(t.resource || ' ' || t.rows
                          || CASE WHEN t.done THEN ' (done)'
                                  WHEN t.cursor IS NULL THEN ' (waiting)'
                                  ELSE ' (after id ' || left(t.cursor, 40) || ')' END,
                          ', ' ORDER BY t.position)
          FROM webhooks.backfill_tables t WHERE t.backfill_id = b.id) AS progress
  FROM webhooks.backfills b
 WHERE b.status = 'running'
    OR (b.status = 'failed' AND b.finished_at > now() - interval '1 day')
 ORDER BY b.status = 'running' DESC, b.id DESC
 LIMIT 20
