-- Queries of the REST API; loaded by service.db.queries().
-- Every subscription query is scoped by owner: another owner's id is as unknown as a
-- missing one. A tenant-scoped token is further limited to its tenant's subscriptions;
-- a token without a tenant sees all of its owner's.

-- name: api_ping --
SELECT 1

-- name: api_resource_events --
-- The registry of one resource, and the noun of the table attached as that resource
-- (NULL when only nested tables are offered under it), which bare verbs refer to.
SELECT e.event, e.public,
       (SELECT a.noun FROM webhooks.attachments a WHERE a.resource = %(resource)s) AS own_noun
  FROM webhooks.hook_events e
 WHERE e.resource = %(resource)s
 ORDER BY e.event

-- name: api_event_columns --
-- For each of a subscription's events, whether it sends a row (a truncate never does) and the columns it may
-- send or name as changed (not excluded, within the allow-list), in table order; NULL
-- columns for the service's own events, which come from no table (filters).
SELECT e.event, a.include_row AND e.event NOT LIKE '%%.truncate' AS include_row,
       CASE WHEN a.table_oid IS NOT NULL THEN
           ARRAY(SELECT t.attname::text FROM pg_attribute t
                  WHERE t.attrelid = a.table_oid AND t.attnum > 0 AND NOT t.attisdropped
                    AND NOT t.attname = ANY (a.exclude_columns)
                    AND (a.columns IS NULL OR t.attname = ANY (a.columns))
                  ORDER BY t.attnum)
       END AS columns
  FROM webhooks.hook_events e
  LEFT JOIN webhooks.attachments a ON a.table_oid = e.table_oid
 WHERE e.resource = %(resource)s AND e.event = ANY (%(events)s::text[])

-- name: api_own_noun --
SELECT noun FROM webhooks.attachments WHERE resource = %(resource)s

-- name: api_public_resources --
SELECT DISTINCT resource
  FROM webhooks.hook_events
 WHERE public
 ORDER BY resource
 LIMIT 50

-- name: api_hook_events --
SELECT resource, event
  FROM webhooks.hook_events
 WHERE public
 ORDER BY resource, event

-- name: api_event_catalog --
-- What the delivery bodies of the public events are made of (service.api.schemas), one
-- row per table with public events and one per resource of the service's own events:
-- its public events, the attachment (NULL for webhook.*), and the table's columns in
-- table order as JSON text, each [name, NOT NULL, type as declared, type reached, its
-- typtype, typmod, through an array, built in, enum labels]: the type looked through
-- domains and into arrays as webhooks.column_sql writes values (a built-in one as JSON, any
-- other as its text form). Read from the catalog at each request, so a column added a
-- moment ago is there; the text is the API's cache key, parsed only when it changed.
WITH RECURSIVE tables AS (
    SELECT e.table_oid, array_agg(e.event ORDER BY e.event) AS events
      FROM webhooks.hook_events e
     WHERE e.public AND e.table_oid IS NOT NULL
     GROUP BY e.table_oid
), walk AS (
    SELECT t.attrelid, t.attnum, t.atttypid AS typ, t.atttypmod AS typmod,
           false AS arr, 0 AS depth
      FROM pg_attribute t
     WHERE t.attrelid IN (SELECT table_oid FROM tables) AND t.attnum > 0
       AND NOT t.attisdropped
    UNION ALL
    SELECT w.attrelid, w.attnum,
           CASE WHEN p.typtype = 'd' THEN p.typbasetype ELSE p.typelem END,
           CASE WHEN p.typtype = 'd' THEN p.typtypmod ELSE w.typmod END,
           w.arr OR p.typtype <> 'd', w.depth + 1
      FROM walk w JOIN pg_type p ON p.oid = w.typ
     WHERE (p.typtype = 'd' OR (p.typcategory = 'A' AND p.typelem <> 0)) AND w.depth < 32
), columns AS (
    SELECT a.attrelid AS table_oid,
           json_agg(json_build_array(
               a.attname, a.attnotnull, format_type(a.atttypid, a.atttypmod), p.typname,
               p.typtype, w.typmod, w.arr, p.oid < 16384,
               CASE WHEN p.typtype = 'e' THEN
                   (SELECT array_agg(l.enumlabel ORDER BY l.enumsortorder)
                      FROM pg_enum l WHERE l.enumtypid = p.oid) END)
               ORDER BY a.attnum)::text AS columns
      FROM walk w
      JOIN pg_type p ON p.oid = w.typ
      JOIN pg_attribute a ON a.attrelid = w.attrelid AND a.attnum = w.attnum
     WHERE NOT (p.typtype = 'd' OR (p.typcategory = 'A' AND p.typelem <> 0))
     GROUP BY a.attrelid
)
SELECT a.hook_resource, t.events, a.resource, a.parent_resource, a.parent_column,
       a.id_column, a.exclude_columns, a.columns AS allowed, a.include_row,
       a.include_previous, c.columns
  FROM tables t
  JOIN webhooks.attachments a ON a.table_oid = t.table_oid
  LEFT JOIN columns c ON c.table_oid = t.table_oid
UNION ALL
SELECT e.resource, array_agg(e.event ORDER BY e.event), NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL
  FROM webhooks.hook_events e
 WHERE e.public AND e.table_oid IS NULL
 GROUP BY e.resource

-- name: api_owner_lock --
-- Serialises the creates of one owner (until commit), so that the count below is exact
-- however many API processes create at once. The two-key form keeps it apart from the
-- migration lock.
SELECT pg_advisory_xact_lock(hashtext('webhooks.subscriptions'), hashtext(%(owner)s))

-- name: api_subscription_count --
SELECT count(*) FROM webhooks.subscriptions WHERE owner = %(owner)s

-- name: api_subscription_insert --
-- Inserts nothing when the owner already has `max` subscriptions; run after api_owner_lock
-- in the same transaction.
-- Returns the subscription as GET shows it (its doc, which the row's trigger wrote).
INSERT INTO webhooks.subscriptions AS s (owner, tenant, resource, events, target, secret,
                                         active, last_status, filter, filter_path, ordering,
                                         rate_limit)
SELECT %(owner)s, %(tenant)s, %(resource)s, %(events)s, %(target)s, %(secret)s, true, 200,
       %(filter)s::jsonb, %(filter_path)s::jsonpath, %(ordering)s, %(rate_limit)s::int
 WHERE (SELECT count(*) FROM webhooks.subscriptions WHERE owner = %(owner)s) < %(max)s
RETURNING s.id, s.doc

-- name: api_subscription_list --
-- The caller's token and a page of its subscriptions, in one statement and one row: a GET
-- costs one round trip, and a token revoked a moment ago already reads nothing. No row:
-- the token is unknown or revoked. Otherwise the token's (id, owner, tenant, hash), the
-- page as the JSON array the API sends (each subscription's doc, as
-- webhooks.subscription_json wrote it when the row last changed), the last id on the
-- page, and whether more follow. A page holds %(limit)s rows at most, and stops after the
-- row that takes its JSON past %(max_bytes)s bytes (so a page always holds a row; the
-- next page starts after it). One row more than asked for tells whether a next page
-- exists.
-- The owner is also given as a range and the order as (owner, id): then only
-- subscriptions_owner_idx yields that order, and a page is one short range of it. With
-- `ORDER BY id` alone the planner may walk the primary key and filter on owner, guessing
-- the owner's rows are spread evenly: 39 ms for the last page-owner among 100,000
-- subscriptions, against 0.6 ms this way.
SELECT t.id AS token_id, t.owner, t.tenant, t.token_hash, p.body, p.last_id, p.more
  FROM webhooks.tokens t
 CROSS JOIN LATERAL (
    SELECT '[' || coalesce(string_agg(r.doc, ',' ORDER BY r.id) FILTER (WHERE r.kept), '')
               || ']' AS body,
           max(r.id) FILTER (WHERE r.kept) AS last_id,
           coalesce(bool_or(NOT r.kept), false) AS more
      -- The rows and bytes before each row are counted as they are read, in the index's
      -- order (owner, id), with no sort of the page between (summed over their
      -- row_number in an outer query, the page was sorted again by it first), and in one
      -- window: a row_number() beside the sum took a second pass over the page.
      FROM (SELECT s.id, s.doc,
                   count(*) OVER before < %(limit)s
                   AND coalesce(sum(octet_length(s.doc) + 1) OVER before, 0)
                       <= %(max_bytes)s AS kept
              FROM webhooks.subscriptions s
             WHERE s.owner = t.owner AND s.owner >= t.owner AND s.owner <= t.owner
               AND (t.tenant IS NULL OR s.tenant = t.tenant)
               AND s.id > %(after)s
               AND (%(resource)s::text IS NULL OR s.resource = %(resource)s::text)
               AND (%(active)s::boolean IS NULL OR s.active = %(active)s::boolean)
            WINDOW before AS (ORDER BY s.owner, s.id
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
             ORDER BY s.owner, s.id
             LIMIT %(limit)s + 1) r) p
 WHERE t.token_hash = %(token_hash)s AND t.revoked_at IS NULL

-- name: api_subscription_get --
-- The caller's token and the subscription's document (NULL when it is not the caller's),
-- in one statement; no row: the token is unknown or revoked.
SELECT t.id AS token_id, t.owner, t.tenant, t.token_hash,
       (SELECT s.doc
          FROM webhooks.subscriptions s
         WHERE s.id = %(id)s AND s.owner = t.owner
           AND (t.tenant IS NULL OR s.tenant = t.tenant)) AS doc
  FROM webhooks.tokens t
 WHERE t.token_hash = %(token_hash)s AND t.revoked_at IS NULL

-- name: api_subscription_lock --
SELECT id, resource, events, target, active, last_status, last_success_at,
       last_failure_at, last_failure_content, filter, ordering, rate_limit
  FROM webhooks.subscriptions
 WHERE id = %(id)s AND owner = %(owner)s
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
   FOR UPDATE

-- name: api_subscription_set_active --
-- Sets active and the rate limit (the bucket follows: sql/ratelimit.sql).
-- Returns the subscription as GET shows it (its doc, which the row's trigger wrote).
UPDATE webhooks.subscriptions AS s
   SET active = %(active)s, rate_limit = %(rate_limit)s::int
 WHERE id = %(id)s AND owner = %(owner)s
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
RETURNING s.id, s.doc

-- name: api_subscription_delete --
-- The subscription's deliveries go with it (a trigger, sql/partitions.sql); its attempts
-- stay until retention drops their partition.
DELETE FROM webhooks.subscriptions
 WHERE id = %(id)s AND owner = %(owner)s
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
RETURNING id

-- name: api_settle_waiting --
-- After a subscription became active (created or re-activated, committed): the writers
-- whose capture probe could not see it yet, polled without waiting.
SELECT webhooks.settle_waiting(%(id)s, %(among)s::text[]) AS waiting

-- name: api_settle_start --
SELECT webhooks.settle_start(%(id)s) AS started

-- name: api_owner_filter_bytes --
-- What the owner's active filters compile to, in bytes, leaving out subscription `id`
-- (the one being activated), and what `filter_path` (the new one) does.
SELECT coalesce(sum(octet_length(filter_path::text)), 0)::bigint AS used,
       coalesce(octet_length(%(filter_path)s::jsonpath::text), 0)::bigint AS wanted
  FROM webhooks.subscriptions
 WHERE owner = %(owner)s AND owner >= %(owner)s AND owner <= %(owner)s
   AND active AND filter_path IS NOT NULL AND id <> %(id)s

-- name: api_subscription_filter_path --
-- The caller's subscription's compiled filter.
SELECT filter_path::text AS filter_path FROM webhooks.subscriptions
 WHERE id = %(id)s AND owner = %(owner)s
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)

-- name: api_subscription_target --
-- The caller's subscription's target, before a handshake with a new target.
SELECT target FROM webhooks.subscriptions
 WHERE id = %(id)s AND owner = %(owner)s
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)

-- name: api_subscription_set_target --
-- Moves the subscription to a target the handshake verified with a newly made secret
-- (sealed), unless its target changed meanwhile (another request): then nothing, and the
-- API says so. The new secret signs from now on; the one it replaces keeps signing beside
-- it for %(overlap)s seconds (none when 0), as after a rotation. Scoped to the caller's
-- subscriptions like every query here, though the API found the target through them.
UPDATE webhooks.subscriptions AS s
   SET target = %(target)s,
       previous_secret = CASE WHEN %(overlap)s::float8 > 0 THEN s.secret END,
       previous_secret_expires_at = CASE WHEN %(overlap)s::float8 > 0
                                         THEN now() + make_interval(secs => %(overlap)s)
                                    END,
       secret = %(secret)s
 WHERE id = %(id)s AND owner = %(owner)s
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
   AND target = %(previous)s
RETURNING id
