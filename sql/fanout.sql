-- Fan-out's side of the outbox: how a captured statement's JSON array becomes one change
-- per row. The worker's fan-out statement (sql/queries/fanout.sql) reads outbox rows
-- through webhooks.change_rows; webhooks.outbox_changes shows what waits, one change a row.
-- Re-applied by every `webhooks migrate`, after sql/triggers/capture.sql.

-- Why a JSON value cannot become JSONB, or NULL when it can.
CREATE OR REPLACE FUNCTION webhooks.jsonb_problem(value json) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_detail text;
BEGIN
    PERFORM value::jsonb;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
    RETURN SQLERRM || coalesce(': ' || nullif(v_detail, ''), '');
END
$$;


-- A JSON object as text with its members in their own order (json keeps it; jsonb sorts
-- them by length, then name) and each value written as jsonb writes it: a captured row
-- goes out with its columns in table order. Anything but an object is written as jsonb.
-- A set-returning function of one row, so that a statement calling it in FROM (fan-out's)
-- inlines it into its own plan: every name is qualified and nothing is SET. A scalar SQL
-- function holding a subquery is never inlined, and is planned again at each statement.
CREATE OR REPLACE FUNCTION webhooks.json_in_order(value json) RETURNS TABLE (json_text text)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pg_catalog.json_typeof(value) OPERATOR(pg_catalog.=) 'object' THEN
               (SELECT '{' OPERATOR(pg_catalog.||) coalesce(pg_catalog.string_agg(
                           pg_catalog.to_json(m.key)::pg_catalog.text
                           OPERATOR(pg_catalog.||) ': '
                           OPERATOR(pg_catalog.||) m.value::pg_catalog.jsonb::pg_catalog.text,
                           ', ' ORDER BY m.ord), '') OPERATOR(pg_catalog.||) '}'
                  FROM pg_catalog.json_each(value) WITH ORDINALITY AS m (key, value, ord))
           ELSE value::pg_catalog.jsonb::pg_catalog.text
           END
    -- Kept a subquery of its own where it is inlined (OFFSET 0), so its result is a
    -- column there: an expression holding a subquery, passed to a function that uses
    -- its argument more than once (webhooks.body_member), would stop that one inlining.
    OFFSET 0
$$;

-- webhooks.json_in_order as a value, for expressions.
CREATE OR REPLACE FUNCTION webhooks.ordered_json(value json) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT o.json_text FROM webhooks.json_in_order(value) o
$$;


-- The changes of one outbox row, one row each, as they are delivered: the row as JSONB
-- (NULL when the table is attached with include_row false), for filters, and as captured
-- (row_json: columns in table order, for the body), its id, parent id, tenant and
-- user_id (the transaction's webhooks.user_id unless empty, else the user column, else
-- the role). For an UPDATE, `changed` names the columns whose values changed, in table
-- order (every sent column when the row's id changed, so no previous row was paired), and
-- `previous` (and previous_json) is the row as it was when the table is attached with
-- include_previous (and include_row). A truncate's one change has neither id nor row.
-- With `careful`, a change whose JSON PostgreSQL cannot take as JSONB (a \u0000 in a json
-- column, say) comes with the reason in `problem` and no values (even json's -> parses,
-- and fails on, the whole element), instead of failing the statement, and `raw` holds it
-- as captured; fan-out sets it aside.
CREATE OR REPLACE FUNCTION webhooks.change_rows(o webhooks.outbox, careful boolean DEFAULT false)
RETURNS TABLE (n bigint, resource_id jsonb, parent_id jsonb, user_id text,
               tenant_scoped boolean, tenant text, row_data jsonb, problem text, raw json,
               changed text[], previous jsonb, row_json json, previous_json json)
-- Inlined into fan-out's statement (planned once with it, not again at every statement):
-- so every name and operator is qualified and nothing is SET.
LANGUAGE sql STABLE AS $$
    SELECT e.n,
           CASE WHEN p.problem IS NULL THEN e.a[1]::pg_catalog.jsonb END,
           CASE WHEN p.problem IS NULL AND o.parent_resource IS NOT NULL
                THEN e.a[2]::pg_catalog.jsonb END,
           coalesce(CASE WHEN o.user_setting OPERATOR(pg_catalog.<>) '' THEN o.user_setting END,
                    CASE WHEN p.problem IS NULL THEN e.a[4] OPERATOR(pg_catalog.#>>) '{}' END,
                    o.role),
           o.tenant_scoped,
           CASE WHEN p.problem IS NULL THEN e.a[3] OPERATOR(pg_catalog.#>>) '{}' END,
           CASE WHEN p.problem IS NULL AND o.include_row THEN e.a[5]::pg_catalog.jsonb END,
           p.problem,
           CASE WHEN p.problem IS NOT NULL THEN e.j END,
           CASE WHEN p.problem IS NULL AND pg_catalog.cardinality(e.a) OPERATOR(pg_catalog.>) 5
           THEN
               -- Each row is walked once and the columns matched by a hash join on their
               -- names (`e.j -> 5 -> key` per column parsed the whole element again for
               -- every column: 8.5 s for a 300-column, 900 kB row). Values compare as
               -- their captured text, as before.
               (SELECT coalesce(pg_catalog.array_agg(c.key ORDER BY c.ord), '{}')
                  FROM pg_catalog.json_each(e.a[5]) WITH ORDINALITY AS c (key, value, ord)
                  LEFT JOIN pg_catalog.json_each(
                           CASE WHEN pg_catalog.json_typeof(e.a[6]) OPERATOR(pg_catalog.=) 'object'
                                THEN e.a[6] END) AS b (key, value)
                         ON b.key OPERATOR(pg_catalog.=) c.key
                 WHERE b.value IS NULL
                    OR b.value::pg_catalog.text OPERATOR(pg_catalog.<>) c.value::pg_catalog.text)
           END,
           -- No row, no old row: attachments made before attach refused include_previous
           -- without include_row may have queued both.
           CASE WHEN p.problem IS NULL AND o.include_row AND o.include_previous
                     AND pg_catalog.cardinality(e.a) OPERATOR(pg_catalog.>) 5
                     AND pg_catalog.json_typeof(e.a[6]) OPERATOR(pg_catalog.=) 'object'
                THEN e.a[6]::pg_catalog.jsonb END,
           CASE WHEN p.problem IS NULL AND o.include_row THEN e.a[5] END,
           CASE WHEN p.problem IS NULL AND o.include_row AND o.include_previous
                     AND pg_catalog.cardinality(e.a) OPERATOR(pg_catalog.>) 5
                     AND pg_catalog.json_typeof(e.a[6]) OPERATOR(pg_catalog.=) 'object'
                THEN e.a[6] END
      -- Each change's JSON array is parsed once, into an array of its parts (id, parent
      -- id, tenant, user, row, old row); every `->` on the json parsed it whole again.
      -- OFFSET 0 keeps that array a column: pulled up, its subquery would run once per use.
      FROM (SELECT r.j, r.n,
                   CASE WHEN pg_catalog.json_typeof(r.j) OPERATOR(pg_catalog.=) 'array' THEN
                       (SELECT pg_catalog.array_agg(x.v ORDER BY x.k)
                          FROM pg_catalog.json_array_elements(r.j) WITH ORDINALITY AS x (v, k))
                   END AS a
              FROM pg_catalog.json_array_elements(o.rows) WITH ORDINALITY AS r (j, n) OFFSET 0) e
     CROSS JOIN LATERAL (SELECT CASE WHEN careful THEN webhooks.jsonb_problem(e.j) END
                                AS problem) p
$$;

-- webhooks.change_rows without the texts as sent (the view below shows these).
CREATE OR REPLACE FUNCTION webhooks.changes(o webhooks.outbox, careful boolean DEFAULT false)
RETURNS TABLE (n bigint, resource_id jsonb, parent_id jsonb, user_id text,
               tenant_scoped boolean, tenant text, row_data jsonb, problem text, raw json,
               changed text[], previous jsonb)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.n, c.resource_id, c.parent_id, c.user_id, c.tenant_scoped, c.tenant,
           c.row_data, c.problem, c.raw, c.changed, c.previous
      FROM webhooks.change_rows(o, careful) c
$$;


-- What is waiting for fan-out, one change a row, in capture order.
CREATE OR REPLACE VIEW webhooks.outbox_changes AS
SELECT o.id AS outbox_id, c.n, o.hook_resource, o.name, o.resource, c.resource_id,
       o.parent_resource, c.parent_id, c.user_id, c.tenant_scoped, c.tenant, o.occurred_at,
       c.row_data, c.changed, c.previous
  FROM webhooks.outbox o
 CROSS JOIN LATERAL webhooks.changes(o) c;

-- Whether a change passes a subscription's filter: `filter_path` is the
-- filter compiled by the API (service/filters.py) to a strict SQL/JSON path predicate on
-- the row as sent, with $changed (the changed columns, [] unless an update) and $update.
-- NULL passes everything; an error (a column that is not there any more) passes nothing.
-- Every name is qualified and nothing is SET, so fan-out's statement inlines it.
CREATE OR REPLACE FUNCTION webhooks.filter_passes(filter_path jsonpath, row_data jsonb,
                                                  changed text[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT filter_path IS NULL
        OR coalesce(pg_catalog.jsonb_path_exists(
               coalesce(row_data, '{}'::pg_catalog.jsonb), filter_path,
               pg_catalog.jsonb_build_object(
                   'changed', coalesce(pg_catalog.to_jsonb(changed), '[]'::pg_catalog.jsonb),
                   'update', changed IS NOT NULL),
               true), false)
$$;

-- The `event` member of a delivery body, its members in the documented order (`parent`
-- and an update's `changed` only when present), written as jsonb writes values. Every
-- name is qualified and nothing is SET, so fan-out's statement inlines it.
CREATE OR REPLACE FUNCTION webhooks.event_json(
    event_id bigint, name text, resource text, resource_id jsonb, user_id text,
    occurred_at timestamptz, parent jsonb DEFAULT NULL, changed jsonb DEFAULT NULL
) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.concat(
        '{"id": ', event_id,
        ', "name": ', pg_catalog.to_json(name),
        ', "resource": ', pg_catalog.to_json(resource),
        ', "resource_id": ', coalesce(resource_id::pg_catalog.text, 'null'),
        ', "parent": ' OPERATOR(pg_catalog.||) parent::pg_catalog.text,
        ', "user_id": ', coalesce(pg_catalog.to_json(user_id)::pg_catalog.text, 'null'),
        ', "occurred_at": "', pg_catalog.to_char(occurred_at AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        '"', ', "changed": ' OPERATOR(pg_catalog.||) changed::pg_catalog.text,
        '}')
$$;

-- A member after `event` in a delivery body, with its leading ", ": `value` (JSON text)
-- under `name`, or `"<name>_omitted": "too_large"` when it is over `max_bytes`, or nothing
-- when there is no value. STABLE, as to_json is: a function declared IMMUTABLE whose body
-- is not is never inlined.
CREATE OR REPLACE FUNCTION webhooks.body_member(name text, value text, max_bytes integer)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN value IS NULL THEN ''
                WHEN max_bytes IS NULL
                     OR pg_catalog.octet_length(value) OPERATOR(pg_catalog.<=) max_bytes
                THEN ', ' OPERATOR(pg_catalog.||) pg_catalog.to_json(name)::pg_catalog.text
                     OPERATOR(pg_catalog.||) ': ' OPERATOR(pg_catalog.||) value
                ELSE ', ' OPERATOR(pg_catalog.||)
                     pg_catalog.to_json(name OPERATOR(pg_catalog.||) '_omitted')::pg_catalog.text
                     OPERATOR(pg_catalog.||) ': "too_large"'
           END
$$;

-- The delivery body of an event, built once per event when it is queued: fan-out, the
-- operational events, backfills and test events all build it from webhooks.event_json
-- and webhooks.body_member: `{"event": {...}, "resource": {...}, "previous": {...}}`.
-- This form takes the members after `event` as jsonb (`resource` first, then
-- `previous`, each also as `<name>_omitted`), for callers without a row in table order.
CREATE OR REPLACE FUNCTION webhooks.event_body(
    event_id bigint, name text, resource text, resource_id jsonb, user_id text,
    occurred_at timestamptz, parent jsonb DEFAULT NULL, members jsonb DEFAULT '{}',
    changed jsonb DEFAULT NULL
) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT '{"event": ' OPERATOR(pg_catalog.||)
           webhooks.event_json(event_id, name, resource, resource_id, user_id, occurred_at,
                               parent, changed)
           OPERATOR(pg_catalog.||) coalesce(
               (SELECT pg_catalog.string_agg(
                           webhooks.body_member(m.key, m.value::pg_catalog.text, NULL), ''
                           ORDER BY pg_catalog.array_position(
                                        ARRAY['resource', 'resource_omitted', 'previous',
                                              'previous_omitted'], m.key),
                                    m.key)
                  FROM pg_catalog.jsonb_each(members) AS m (key, value)), '')
           OPERATOR(pg_catalog.||) '}'
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC;
