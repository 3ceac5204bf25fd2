-- Fan-out: captured changes leave the outbox as events and deliveries; loaded by
-- service.db.queries().

-- name: fanout --
-- Moves one batch of captured statements out of the outbox, one change per row they
-- changed. Only changes some active subscription wants are kept as events, each with its
-- delivery body built once, here, and one delivery per matching subscription, created in
-- capture order. The advisory lock keeps fan-out to one worker at a time, so deliveries
-- are created in event order even when many workers run; a worker that does not get it
-- skips (the holder drains the outbox).
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(%(lock_key)s) AS ok
), batch AS (
    DELETE FROM webhooks.outbox o
     WHERE o.id IN (SELECT id FROM webhooks.outbox
                     WHERE (SELECT ok FROM lock)
                     ORDER BY id
                     LIMIT %(limit)s
                     FOR UPDATE SKIP LOCKED)
    RETURNING o.id, o
), changes AS (
    SELECT nextval('webhooks.event_ids') AS event_id, ordered.*
      FROM (SELECT (b.o).hook_resource, (b.o).name, (b.o).resource, (b.o).parent_resource,
                   (b.o).occurred_at, c.*
              FROM batch b
             CROSS JOIN LATERAL webhooks.changes(b.o) c
             ORDER BY b.id, c.n) ordered
), matched AS (
    SELECT ch.event_id, s.id AS subscription_id
      FROM changes ch
      JOIN webhooks.subscriptions s
        ON s.active
       AND s.resource = ch.hook_resource
       AND ch.name = ANY (s.events)
       AND (s.tenant IS NULL OR NOT ch.tenant_scoped OR s.tenant = ch.tenant)
), kept AS (
    INSERT INTO webhooks.events (id, hook_resource, name, tenant, occurred_at, body)
    SELECT ch.event_id, ch.hook_resource, ch.name, ch.tenant, ch.occurred_at,
           -- || adds the optional members only when present; jsonb_strip_nulls would
           -- also drop the row's own null columns.
           (jsonb_build_object(
               'event', jsonb_build_object(
                   'id', ch.event_id,
                   'name', ch.name,
                   'resource', ch.resource,
                   'resource_id', ch.resource_id,
                   'user_id', ch.user_id,
                   'occurred_at', to_char(ch.occurred_at AT TIME ZONE 'UTC',
                                          'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
               || CASE WHEN ch.parent_resource IS NOT NULL
                       THEN jsonb_build_object('parent', jsonb_build_object(
                                'resource', ch.parent_resource,
                                'resource_id', ch.parent_id))
                       ELSE '{}'::jsonb END)
           -- A row over the size limit is left out and flagged, rather than blocking
           -- the queue with a body no target would take.
           || CASE WHEN ch.row_data IS NULL THEN '{}'::jsonb
                   WHEN octet_length(ch.row_data::text) <= %(max_row_bytes)s
                   THEN jsonb_build_object('resource', ch.row_data)
                   ELSE jsonb_build_object('resource_omitted', 'too_large') END
           )::text
      FROM changes ch
     WHERE ch.event_id IN (SELECT event_id FROM matched)
    RETURNING id
), created AS (
    INSERT INTO webhooks.deliveries (event_id, subscription_id)
    SELECT m.event_id, m.subscription_id
      FROM matched m
      JOIN kept k ON k.id = m.event_id
     ORDER BY m.event_id, m.subscription_id
    RETURNING 1
)
SELECT (SELECT ok FROM lock) AS locked,
       (SELECT count(*) FROM batch) AS taken,
       (SELECT count(*) FROM changes) AS changes,
       (SELECT count(*) FROM created) AS created
