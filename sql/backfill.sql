-- Backfill: every current row of the tables a subscription listens to,
-- delivered once as `<noun>.snapshot` through the normal queue. Re-applied by every
-- `webhooks migrate` (sql/replaceable.txt); the REST API starts backfills
-- (webhooks.start_backfill) and the workers run them a batch at a time
-- (webhooks.backfill_step, service/worker/backfill.py). A DBA may call both.
--
-- What a backfill does to the application's tables: plain SELECTs, in keyset batches on
-- the attachment's id column (`id > cursor AND id <= the greatest id at the table's first
-- batch ORDER BY id LIMIT n`), each batch in its own short transaction. It takes only
-- ACCESS SHARE locks (what any SELECT takes: only DDL such as ALTER TABLE or DROP TABLE
-- waits for it; a batch waits at most lock_timeout = 1s behind DDL) and holds no snapshot
-- between batches, so vacuum and the application's writers go on. A batch's deliveries and the cursor that
-- follows it are written in one transaction: a worker killed mid-backfill leaves either
-- both or neither, and the next worker goes on from the stored cursor (no row lost, no
-- row queued twice). Batches take the backfill's row FOR UPDATE SKIP LOCKED, so two
-- workers never run the same backfill at once.
--
-- Privileges, as in the capture (sql/triggers/capture.sql): rows become JSON through
-- webhooks.column_sql / webhooks.row_sql, which run no cast or function a type's owner
-- wrote; the keyset comparison and ORDER BY run the id column's type's own operators, so a
-- backfill is allowed only when that type is built into PostgreSQL (webhooks.backfill_problem);
-- batches read with row_security off, so no policy expression runs with the service's
-- rights (a table whose policies apply to the service's role is refused). Every name is schema-qualified or quoted, every function sets its search_path, and
-- EXECUTE is revoked from PUBLIC.

-- Why the attachment's table cannot be backfilled, or NULL when it can: the id column's
-- type must be built into PostgreSQL (the keyset comparison and ORDER BY run its
-- operators) and have an ordering, and the table must be readable without row-level
-- security policies (a policy is an expression the table's owner wrote, which a SELECT
-- would run with the service's rights: backfills read with row_security off, so such a
-- table is refused unless the service's role bypasses its policies anyway). Checked by
-- planning `ORDER BY id LIMIT 0`, which reads no row and runs no code of the table's.
CREATE OR REPLACE FUNCTION webhooks.backfill_problem(a webhooks.attachments) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET row_security = off AS $$
DECLARE
    v_type oid;
BEGIN
    SELECT t.atttypid INTO v_type FROM pg_attribute t
     WHERE t.attrelid = a.table_oid AND t.attname = a.id_column
       AND t.attnum > 0 AND NOT t.attisdropped;
    IF NOT FOUND THEN
        RETURN format('table %s has no id column %I', a.table_oid, a.id_column);
    END IF;
    IF v_type >= 16384 THEN  -- FirstNormalObjectId: not built into the server
        RETURN format('table %s cannot be backfilled: its id column %I has type %s, which '
                      'is not built into PostgreSQL (a backfill reads rows in id order and '
                      'runs only built-in comparisons); attach it with an id_column of a '
                      'built-in type such as bigint, text or uuid',
                      a.table_oid, a.id_column, format_type(v_type, NULL));
    END IF;
    BEGIN
        EXECUTE format('SELECT 1 FROM %s c ORDER BY c.%I LIMIT 0', webhooks.backfill_from(a),
                       a.id_column);
    EXCEPTION
        WHEN undefined_function THEN
            RETURN format('table %s cannot be backfilled: its id column %I has type %s, which '
                          'has no ordering', a.table_oid, a.id_column, format_type(v_type, NULL));
        WHEN insufficient_privilege THEN
            IF (SELECT c.relrowsecurity FROM pg_class c WHERE c.oid = a.table_oid) THEN
                RETURN format('table %s cannot be backfilled: it has row-level security, and a '
                              'backfill never runs its policies (expressions its owner wrote) '
                              'with the service''s rights; run the workers as a role that '
                              'bypasses them (BYPASSRLS)', a.table_oid);
            END IF;
            RETURN format('table %s cannot be backfilled: the service''s role may not read it '
                          '(GRANT SELECT ON %s TO %I)', a.table_oid, a.table_oid, current_user);
    END;
    RETURN NULL;
END
$$;


-- Starts a backfill of the subscription: the public attached tables under its resource
-- whose nouns its events name, in resource order. Returns the backfill's id.
-- Errors, for callers to map: P0002 unknown subscription, 55000 inactive subscription,
-- 55006 a backfill of it is still running, 22023 nothing to backfill or a table that
-- cannot be backfilled (the message says which and why).
CREATE OR REPLACE FUNCTION webhooks.start_backfill(subscription_id bigint,
                                                   max_per_owner integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s webhooks.subscriptions;
    a webhooks.attachments;
    v_problem text;
    v_running bigint;
    v_id bigint;
    v_position integer := 0;
BEGIN
    SELECT * INTO s FROM webhooks.subscriptions x WHERE x.id = start_backfill.subscription_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no webhook with id %', start_backfill.subscription_id
              USING ERRCODE = 'no_data_found';
    END IF;
    IF NOT s.active THEN
        RAISE EXCEPTION 'webhook % is inactive; activate it before a backfill', s.id
              USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    SELECT b.id INTO v_running FROM webhooks.backfills b
     WHERE b.subscription_id = s.id AND b.status = 'running';
    IF FOUND THEN
        RAISE EXCEPTION 'backfill % of webhook % is still running', v_running, s.id
              USING ERRCODE = 'object_in_use';
    END IF;
    IF max_per_owner IS NOT NULL THEN
        -- Starts of one owner are counted one at a time, so two at once cannot both pass.
        PERFORM pg_advisory_xact_lock(hashtext('webhooks.start_backfill'), hashtext(s.owner));
        IF (SELECT count(*) FROM webhooks.backfills b
              JOIN webhooks.subscriptions x ON x.id = b.subscription_id
             WHERE x.owner = s.owner AND b.status = 'running') >= max_per_owner THEN
            RAISE EXCEPTION '% backfills of this owner are running, the most at once; start '
                            'this one when one of them is done', max_per_owner
                  USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END IF;
    INSERT INTO webhooks.backfills (subscription_id) VALUES (s.id) RETURNING id INTO v_id;
    FOR a IN
        SELECT x.* FROM webhooks.attachments x
         WHERE x.hook_resource = s.resource AND x.public
           AND x.noun = ANY (SELECT split_part(e, '.', 1) FROM unnest(s.events) AS e)
         ORDER BY x.resource
    LOOP
        -- The table's lock first, then what it is: nothing of it is planned or read
        -- unless it is still an ordinary table with its key (webhooks.lock_attached).
        v_problem := coalesce(webhooks.lock_attached(a), webhooks.backfill_problem(a));
        IF v_problem IS NOT NULL THEN
            RAISE EXCEPTION '%', v_problem USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_position := v_position + 1;
        INSERT INTO webhooks.backfill_tables (backfill_id, position, table_oid, resource)
        VALUES (v_id, v_position, a.table_oid, a.resource);
    END LOOP;
    IF v_position = 0 THEN
        RAISE EXCEPTION 'webhook % has no events of an attached table to backfill (its events: %)',
              s.id, array_to_string(s.events, ', ')
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN v_id;
EXCEPTION WHEN unique_violation THEN
    -- Another start for the same subscription committed first (backfills_one_running_idx).
    RAISE EXCEPTION 'a backfill of webhook % is already running', start_backfill.subscription_id
          USING ERRCODE = 'object_in_use';
END
$$;


-- Before a backfill starts (the API calls it in a transaction of its own, so that what
-- it finds stays): every table the subscription's events come from is locked and checked
-- (webhooks.lock_attached); one that is no longer an ordinary table with its key is
-- forgotten as DROP TABLE would be, and the first such reason is returned. NULL when all
-- may be read.
CREATE OR REPLACE FUNCTION webhooks.check_backfill_tables(subscription_id bigint)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a webhooks.attachments;
    v_problem text;
    v_first text;
BEGIN
    FOR a IN
        SELECT x.* FROM webhooks.attachments x
          JOIN webhooks.subscriptions s ON s.id = check_backfill_tables.subscription_id
         WHERE x.hook_resource = s.resource
           AND x.noun = ANY (SELECT split_part(e, '.', 1) FROM unnest(s.events) AS e)
         ORDER BY x.resource
    LOOP
        v_problem := webhooks.lock_attached(a);
        v_first := coalesce(v_first, v_problem);
    END LOOP;
    RETURN v_first;
END
$$;


-- What a backfill reads of an attached table: its own rows, not those of tables that
-- INHERIT from it (each is attached, or not, in its own right), so ONLY; a partitioned
-- table has no rows of its own, and its partitions' are its rows.
CREATE OR REPLACE FUNCTION webhooks.backfill_from(a webhooks.attachments) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN c.relkind = 'p' THEN '' ELSE 'ONLY ' END || a.table_oid::text
      FROM pg_class c WHERE c.oid = a.table_oid
$$;


-- The statement of one batch of one table: the page of at most $2 ids after the cursor
-- $1 (every row whose id equals the page's last id comes along, so equal ids never
-- straddle two batches), its rows as snapshots (tenant $3 when `tenant_scoped`, filter $4
-- when `filtered`), one event and one delivery to subscription $5 each, in id order.
-- $6 is the row size limit (WEBHOOKS_MAX_ROW_BYTES), $7 the events' occurred_at, $8 the
-- greatest id to read.
-- Returns one row: the page's size, rows read, the new cursor, deliveries queued, the
-- first delivery.
CREATE OR REPLACE FUNCTION webhooks.backfill_sql(a webhooks.attachments, tenant_scoped boolean,
                                      filtered boolean) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id text := 'c.' || quote_ident(a.id_column);
    v_type text;
    v_after text;
    v_tenant text := '';
BEGIN
    SELECT format('%I.%I', n.nspname, t.typname) INTO v_type
      FROM pg_attribute x
      JOIN pg_type t ON t.oid = x.atttypid
      JOIN pg_namespace n ON n.oid = t.typnamespace
     WHERE x.attrelid = a.table_oid AND x.attname = a.id_column
       AND x.attnum > 0 AND NOT x.attisdropped;
    v_after := format('($1::pg_catalog.text IS NULL OR %s OPERATOR(pg_catalog.>) $1::%s)'
                      ' AND %s OPERATOR(pg_catalog.<=) $8::%s',
                      v_id, v_type, v_id, v_type);
    IF tenant_scoped THEN
        v_tenant := format(' AND (%s) OPERATOR(pg_catalog.=) $3::pg_catalog.text',
                           webhooks.column_sql(a.table_oid, a.tenant_column, true));
    END IF;
    RETURN format($q$
WITH page AS (
    SELECT %1$s AS k FROM %2$s c
     WHERE %1$s IS NOT NULL AND %3$s%4$s
     ORDER BY %1$s
     LIMIT $2
), last AS (
    SELECT p.k FROM page p ORDER BY p.k DESC LIMIT 1
), picked AS (
    SELECT pg_catalog.row_number() OVER (ORDER BY %1$s) AS n,
           pg_catalog.to_jsonb(%5$s) AS resource_id,
           %6$s AS parent_id,
           %7$s AS tenant,
           %8$s AS user_id,
           %9$s AS row_json
      FROM %2$s c
     WHERE %3$s%4$s AND %1$s OPERATOR(pg_catalog.<=) (SELECT l.k FROM last l)
), kept AS (
    SELECT pg_catalog.nextval('webhooks.event_ids'::pg_catalog.regclass) AS event_id, o.*
      FROM (SELECT p.* FROM picked p WHERE %10$s ORDER BY p.n) o
), ev AS (
    INSERT INTO webhooks.events (id, hook_resource, name, tenant, occurred_at, body)
    SELECT k.event_id, %11$L, %12$L, k.tenant, $7,
           '{"event": ' OPERATOR(pg_catalog.||)
           webhooks.event_json(k.event_id, %12$L, %13$L, k.resource_id, k.user_id, $7, %14$s)
           OPERATOR(pg_catalog.||) webhooks.body_member(
               'resource', webhooks.ordered_json(k.row_json), $6)
           OPERATOR(pg_catalog.||) '}'
      FROM kept k
    RETURNING 1
), created AS (
    INSERT INTO webhooks.deliveries (event_id, subscription_id)
    SELECT k.event_id, $5 FROM kept k ORDER BY k.event_id
    RETURNING id, created_at
)
SELECT (SELECT pg_catalog.count(*) FROM page) AS paged,
       (SELECT pg_catalog.count(*) FROM picked) AS scanned,
       (SELECT pg_catalog.format('%%s', l.k) FROM last l) AS cursor,
       (SELECT pg_catalog.count(*) FROM created) AS queued,
       (SELECT pg_catalog.count(*) FROM ev) AS events,
       (SELECT c.id FROM created c ORDER BY c.id LIMIT 1) AS gate_id,
       (SELECT c.created_at FROM created c ORDER BY c.id LIMIT 1) AS gate_at
$q$,
        v_id, webhooks.backfill_from(a), v_after, v_tenant,
        webhooks.column_sql(a.table_oid, a.id_column),
        CASE WHEN a.parent_column IS NULL THEN 'NULL::pg_catalog.jsonb'
             ELSE format('pg_catalog.to_jsonb(%s)',
                         webhooks.column_sql(a.table_oid, a.parent_column)) END,
        CASE WHEN a.tenant_column IS NULL THEN 'NULL::pg_catalog.text'
             ELSE webhooks.column_sql(a.table_oid, a.tenant_column, true) END,
        CASE WHEN a.user_column IS NULL THEN 'NULL::pg_catalog.text'
             ELSE webhooks.column_sql(a.table_oid, a.user_column, true) END,
        CASE WHEN a.include_row THEN webhooks.row_sql(a) ELSE 'NULL::pg_catalog.json' END,
        CASE WHEN filtered
             THEN 'webhooks.filter_passes($4::pg_catalog.jsonpath, p.row_json::pg_catalog.jsonb, '
                  'NULL::pg_catalog.text[])'
             ELSE 'true' END,
        a.hook_resource, a.noun || '.snapshot', a.resource,
        CASE WHEN a.parent_resource IS NULL THEN 'NULL::pg_catalog.jsonb'
             ELSE format('pg_catalog.jsonb_build_object(''resource'', %L::pg_catalog.text, '
                         '''resource_id'', k.parent_id)', a.parent_resource) END);
END
$$;


-- Marks a running backfill failed with `reason`.
CREATE OR REPLACE FUNCTION webhooks.fail_backfill(backfill_id bigint, reason text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    UPDATE webhooks.backfills b
       SET status = 'failed', error = fail_backfill.reason, finished_at = now(),
           updated_at = now()
     WHERE b.id = fail_backfill.backfill_id AND b.status = 'running'
$$;


-- One batch of one running backfill that no other worker is running and whose gate is
-- open (fewer than `ahead` batches of it still have their first delivery pending; oldest
-- backfill first): reads up to `batch_size` rows of its current table,
-- queues their snapshots and moves the cursor, in the caller's transaction. No row when
-- there is nothing to do. A backfill fails (status 'failed', with the reason in `error`)
-- when its subscription became inactive, a table was detached or cannot be backfilled any
-- more, or a batch fails on its data or rights; other errors (a lost connection, a
-- timeout, DDL holding the table's lock past lock_timeout) leave it as it was, for the
-- next try. Row-level security is off, so a policy is never run (see
-- webhooks.backfill_problem). Timestamps in rows are written in UTC,
-- and floats with every digit, so that the stored cursor reads back as the same value.
CREATE OR REPLACE FUNCTION webhooks.backfill_step(batch_size integer, max_row_bytes integer,
                                       ahead integer DEFAULT 1)
RETURNS TABLE (backfill_id bigint, subscription_id bigint, status text, rows bigint,
               queued bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET "TimeZone" = 'UTC'
SET "DateStyle" = 'ISO, YMD'
SET "IntervalStyle" = 'postgres'
SET extra_float_digits = 3
SET row_security = off
SET lock_timeout = '1s'
AS $$
#variable_conflict use_column
DECLARE
    b webhooks.backfills;
    s webhooks.subscriptions;
    t webhooks.backfill_tables;
    a webhooks.attachments;
    v_filter text;
    v_problem text;
    v_detail text;
    v_paged bigint;
    v_scanned bigint;
    v_cursor text;
    v_queued bigint;
    v_events bigint;
    v_gate_id bigint;
    v_gate_at timestamptz;
    v_done boolean;
BEGIN
    -- Fair between owners: the ready backfill of the owner served longest ago (by the
    -- latest batch of any of its running backfills; never served first), then its
    -- backfill served longest ago. An owner's twentieth backfill waits its turn behind
    -- other owners' first ones, not the other way round.
    SELECT x.* INTO b FROM webhooks.backfills x
      JOIN webhooks.subscriptions o ON o.id = x.subscription_id
     WHERE x.status = 'running'
       AND (cardinality(x.gate_ids) < greatest(ahead, 1)
            OR NOT EXISTS (SELECT 1 FROM webhooks.deliveries d
                            WHERE d.id = x.gate_ids[1] AND d.created_at = x.gate_times[1]
                              AND d.status = 'pending'))
     ORDER BY (SELECT max(y.updated_at) FROM webhooks.backfills y
                 JOIN webhooks.subscriptions z ON z.id = y.subscription_id
                WHERE z.owner = o.owner AND y.status = 'running' AND y.batches > 0)
              ASC NULLS FIRST,
              x.batches > 0, x.updated_at, x.id
     LIMIT 1
       FOR UPDATE OF x SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT x.* INTO s FROM webhooks.subscriptions x WHERE x.id = b.subscription_id;
    SELECT x.* INTO t FROM webhooks.backfill_tables x
     WHERE x.backfill_id = b.id AND NOT x.done
     ORDER BY x.position LIMIT 1;
    IF NOT s.active THEN
        v_problem := format('webhook %s became inactive; start a new backfill once it is '
                            'active again', s.id);
    ELSIF t.backfill_id IS NOT NULL THEN
        SELECT x.* INTO a FROM webhooks.attachments x WHERE x.table_oid = t.table_oid;
        IF NOT FOUND THEN
            v_problem := format('table %s (resource %s) was detached', t.table_oid, t.resource);
        ELSE
            -- Locked, then checked, before anything of it is planned or read; a table
            -- that is no longer an ordinary one with its key is forgotten as DROP TABLE
            -- would be (webhooks.lock_attached), and the backfill fails saying why.
            v_problem := coalesce(webhooks.lock_attached(a), webhooks.backfill_problem(a));
        END IF;
    END IF;
    IF v_problem IS NOT NULL THEN
        PERFORM webhooks.fail_backfill(b.id, v_problem);
        RETURN QUERY SELECT b.id, b.subscription_id, 'failed'::text, b.rows, 0::bigint;
        RETURN;
    END IF;

    IF t.backfill_id IS NOT NULL THEN
        -- The subscription's filter (migration 0006), read so that this function does not
        -- depend on the column's existence.
        v_filter := pg_catalog.to_jsonb(s) ->> 'filter_path';
        BEGIN
            IF t.until_id IS NULL THEN
                -- The first batch of the table: the greatest id now bounds the backfill.
                EXECUTE format('SELECT pg_catalog.format(''%%s'', c.%I) FROM %s c'
                               ' WHERE c.%I IS NOT NULL ORDER BY c.%I DESC LIMIT 1',
                               a.id_column, webhooks.backfill_from(a), a.id_column, a.id_column)
                   INTO t.until_id;
            END IF;
            EXECUTE webhooks.backfill_sql(a, s.tenant IS NOT NULL AND a.tenant_column IS NOT NULL,
                                          v_filter IS NOT NULL)
               INTO v_paged, v_scanned, v_cursor, v_queued, v_events, v_gate_id, v_gate_at
              USING t.cursor, batch_size, s.tenant, v_filter, s.id, max_row_bytes, now(),
                    t.until_id;
        EXCEPTION WHEN data_exception OR syntax_error_or_access_rule_violation
                       OR program_limit_exceeded THEN
            GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
            v_problem := format('table %s, %s: %s%s', t.table_oid,
                                coalesce('the rows after id ' || t.cursor, 'the first rows'),
                                SQLERRM, coalesce(': ' || nullif(v_detail, ''), ''));
        END;
        IF v_problem IS NOT NULL THEN
            PERFORM webhooks.fail_backfill(b.id, v_problem);
            RETURN QUERY SELECT b.id, b.subscription_id, 'failed'::text, b.rows, 0::bigint;
            RETURN;
        END IF;
        UPDATE webhooks.backfill_tables x
           SET cursor = coalesce(v_cursor, x.cursor), until_id = t.until_id,
               scanned = x.scanned + v_scanned,
               rows = x.rows + v_queued,
               done = v_paged < batch_size OR v_cursor = t.until_id
         WHERE x.backfill_id = t.backfill_id AND x.position = t.position;
        IF v_queued > 0 THEN
            -- A strict subscription's new deliveries wait behind its head, parked
            -- (sql/ordering.sql).
            PERFORM webhooks.park_held(s.id, v_gate_id);
            -- Wake a waiting worker, as fan-out's commits do.
            PERFORM pg_notify('webhooks', '') FROM webhooks.wakeups LIMIT 1;
        END IF;
    END IF;
    v_done := NOT EXISTS (SELECT 1 FROM webhooks.backfill_tables x
                           WHERE x.backfill_id = b.id AND NOT x.done);
    UPDATE webhooks.backfills x
       SET rows = x.rows + coalesce(v_queued, 0),
           batches = x.batches + 1,
           updated_at = now(),
           status = CASE WHEN v_done THEN 'done' ELSE 'running' END,
           finished_at = CASE WHEN v_done THEN now() END,
           gate_ids = CASE WHEN v_gate_id IS NULL THEN x.gate_ids
                           ELSE (x.gate_ids || v_gate_id)[cardinality(x.gate_ids) + 2
                                                          - greatest(ahead, 1):] END,
           gate_times = CASE WHEN v_gate_id IS NULL THEN x.gate_times
                             ELSE (x.gate_times || v_gate_at)[cardinality(x.gate_times) + 2
                                                              - greatest(ahead, 1):] END
     WHERE x.id = b.id;
    RETURN QUERY SELECT b.id, b.subscription_id,
                        CASE WHEN v_done THEN 'done' ELSE 'running' END,
                        b.rows + coalesce(v_queued, 0), coalesce(v_queued, 0);
END
$$;


-- A backfill as the API shows it, with its tables' progress.
CREATE OR REPLACE FUNCTION webhooks.backfill_json(b webhooks.backfills) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT jsonb_build_object(
        'id', b.id,
        'webhook_id', b.subscription_id,
        'status', b.status,
        'rows', b.rows,
        'created_at', to_char(b.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'updated_at', to_char(b.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'finished_at', to_char(b.finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'error', b.error,
        'tables', coalesce((SELECT jsonb_agg(jsonb_build_object(
                                     'resource', t.resource, 'rows', t.rows,
                                     'scanned', t.scanned, 'done', t.done)
                                 ORDER BY t.position)
                              FROM webhooks.backfill_tables t
                             WHERE t.backfill_id = b.id), '[]'::jsonb))
$$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC;
