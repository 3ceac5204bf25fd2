-- Change capture: webhooks.attach / webhooks.detach, the capture function each attached
-- table gets, the subscription registry the capture probes, and the event triggers that
-- keep attachments true to their tables.
--
-- Privilege model (README, "Privileges"): the capture functions run as SECURITY DEFINER so
-- that application roles need no rights on the webhooks schema, which makes them the one
-- place where a writer's statement runs with the service's rights. They therefore run no
-- code that a table's owner or writer can define:
--   * a row becomes JSON column by column, with the column list fixed when the function
--     is generated. Columns of built-in types (through domains and arrays) go through
--     json_build_object, which consults no casts for built-in types; any other type (an
--     enum, a composite, a range or an extension type, which may carry a cast to json
--     that its owner wrote) is sent as its text form, through its output function
--     (format('%s')), which only a superuser can define;
--   * every function, operator and type is schema-qualified (a per-call SET search_path
--     costs about 65 us per statement on PostgreSQL 15), transition tables are read by
--     their trigger names, and the table's columns only as c."name";
--   * what a change is (resource, noun, tenant, columns) is generated from the table's row
--     in webhooks.attachments, and the function checks that the firing table is that row's
--     table: a trigger that some role puts on another table produces nothing. EXECUTE on
--     every function of the schema is revoked from PUBLIC, so no other role can create such
--     a trigger in the first place (EXECUTE is checked when a trigger is created, not
--     when it fires).
-- Every other function sets search_path = pg_catalog, pg_temp.

-- The capture probe's lock: writers hold it (shared, per resource) from the probe to their
-- commit, so that making a subscription active can wait for the writers whose probe ran
-- before the subscription could be seen (webhooks.settle_subscription).
CREATE OR REPLACE FUNCTION webhooks.probe_lock_class() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 2003331939 $$;  -- "whkc"

-- The wakeup's token: a writer sends the NOTIFY that wakes a waiting worker only when it
-- holds this lock (tried, never waited for, held to its commit). Commits that NOTIFY
-- serialise on a database-wide lock held through their WAL flush: with every concurrent
-- writer notifying, eight clients committed 300 transactions/s instead of 1,588, and a
-- lock_timeout the application's roles keep failed their commits. With the token, one
-- writer at a time notifies and the others commit as they would without the service; the
-- worker picks their changes up with the notifying one's, or at its recheck after any
-- fan-out that found work (service/worker/wakeup.py).
CREATE OR REPLACE FUNCTION webhooks.notify_lock_class() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 2003332718 $$;  -- "whkn"


-- The type whose values a value of this type is written as: domains looked through to
-- their base type and arrays into their element type, as json_build_object and the
-- output functions do; NULL for a type that does not exist.
CREATE OR REPLACE FUNCTION webhooks.element_base_type(typ oid) RETURNS oid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record;
BEGIN
    LOOP
        SELECT p.typtype, p.typbasetype, p.typelem, p.typcategory INTO t
          FROM pg_type p WHERE p.oid = element_base_type.typ;
        IF NOT FOUND THEN
            RETURN NULL;
        ELSIF t.typtype = 'd' THEN
            typ := t.typbasetype;
        ELSIF t.typcategory = 'A' AND t.typelem <> 0 THEN
            typ := t.typelem;
        ELSE
            RETURN typ;
        END IF;
    END LOOP;
END
$$;


-- Whether json_build_object turns values of this type into JSON without consulting a cast
-- (PostgreSQL looks for a cast to json only for types that are not built in, after looking
-- through domains and into arrays).
CREATE OR REPLACE FUNCTION webhooks.json_safe_type(typ oid) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    -- FirstNormalObjectId: built into the server.
    SELECT coalesce(webhooks.element_base_type(json_safe_type.typ) < 16384, false)
$$;


-- The SQL expression that turns column `name` of the row alias c into a JSON value
-- (`as_text`: into text, for tenants and users), running no code its type's owner wrote.
CREATE OR REPLACE FUNCTION webhooks.column_sql(table_name regclass, name text,
                                               as_text boolean DEFAULT false) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_type oid;
    v_ref text := 'c.' || quote_ident(column_sql.name);
BEGIN
    SELECT a.atttypid INTO v_type FROM pg_attribute a
     WHERE a.attrelid = column_sql.table_name AND a.attname = column_sql.name
       AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'webhooks.attach: table % has no column %',
            column_sql.table_name, quote_ident(column_sql.name) USING ERRCODE = 'undefined_column';
    END IF;
    IF NOT as_text AND webhooks.json_safe_type(v_type) THEN
        RETURN v_ref;
    END IF;
    RETURN format('CASE WHEN %s IS NULL THEN NULL ELSE pg_catalog.format(''%%s'', %s) END',
                  v_ref, v_ref);
END
$$;


-- The columns that may leave the database in an event's row, in table order: all but the
-- excluded ones, or the attachment's `columns` only.
CREATE OR REPLACE FUNCTION webhooks.row_columns(a webhooks.attachments) RETURNS name[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(t.attname ORDER BY t.attnum), '{}')
      FROM pg_attribute t
     WHERE t.attrelid = a.table_oid AND t.attnum > 0 AND NOT t.attisdropped
       AND NOT t.attname = ANY (a.exclude_columns)
       AND (a.columns IS NULL OR t.attname = ANY (a.columns))
$$;


-- The JSON object of the columns that may leave the database, in table order.
-- json_build_object takes at most 100 arguments, so wider rows are built in parts and
-- joined as text.
CREATE OR REPLACE FUNCTION webhooks.row_sql(a webhooks.attachments) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_parts text[] := '{}';
    v_args text[] := '{}';
    v_column name;
BEGIN
    FOREACH v_column IN ARRAY webhooks.row_columns(a) LOOP
        v_args := v_args || format('%L, %s', v_column, webhooks.column_sql(a.table_oid, v_column));
        IF cardinality(v_args) = 50 THEN
            v_parts := v_parts || format('pg_catalog.json_build_object(%s)',
                                         array_to_string(v_args, ', '));
            v_args := '{}';
        END IF;
    END LOOP;
    IF cardinality(v_args) > 0 OR cardinality(v_parts) = 0 THEN
        v_parts := v_parts || format('pg_catalog.json_build_object(%s)',
                                     array_to_string(v_args, ', '));
    END IF;
    IF cardinality(v_parts) = 1 THEN
        RETURN v_parts[1];
    END IF;
    -- '{' || the parts without their braces, joined by ', ' || '}', parsed back as json.
    RETURN '(''{'' OPERATOR(pg_catalog.||) ' || (
        SELECT string_agg(format('pg_catalog.left(pg_catalog.substr((%s)::pg_catalog.text, 2), -1)', p),
                          ' OPERATOR(pg_catalog.||) '', '' OPERATOR(pg_catalog.||) ')
          FROM unnest(v_parts) AS p)
        || ' OPERATOR(pg_catalog.||) ''}'')::pg_catalog.json';
END
$$;


-- The index an UPDATE's new rows are paired with their old rows by: the table's primary
-- key if it holds `id_column`, else the unique index holding it with the fewest columns
-- (then the first by name); NULL when there is none. Only an index that makes those
-- columns unique at the end of every statement counts: valid, not partial, no expression,
-- not deferrable.
CREATE OR REPLACE FUNCTION webhooks.pairing_index(table_name regclass, id_column text)
RETURNS regclass
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT i.indexrelid::regclass
      FROM pg_index i
      JOIN pg_class x ON x.oid = i.indexrelid
     WHERE i.indrelid = pairing_index.table_name
       AND i.indisunique AND i.indisvalid AND i.indimmediate
       AND i.indpred IS NULL AND i.indexprs IS NULL
       AND EXISTS (SELECT 1 FROM generate_series(0, i.indnkeyatts - 1) AS k (n)
                     JOIN pg_attribute a ON a.attrelid = i.indrelid
                                        AND a.attnum = i.indkey[k.n]
                    WHERE a.attname = pairing_index.id_column)
     ORDER BY i.indisprimary DESC, i.indnkeyatts, x.relname
     LIMIT 1
$$;

-- The columns of that index (webhooks.pairing_index), in index order; INCLUDE columns are
-- not part of it. NULL when there is none.
CREATE OR REPLACE FUNCTION webhooks.pairing_key(table_name regclass, id_column text)
RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT (SELECT array_agg(a.attname::text ORDER BY k.n)
              FROM generate_series(0, i.indnkeyatts - 1) AS k (n)
              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[k.n])
      FROM pg_index i
     WHERE i.indexrelid = webhooks.pairing_index(pairing_key.table_name,
                                                 pairing_key.id_column)
$$;


-- Why the attachment's table may not be read or captured any more, or NULL when it may:
-- it must still be an ordinary or partitioned table (a table turned into a view, by a
-- rule on PostgreSQL 15 and older, would run its owner's query with the reader's
-- rights), every partition an ordinary table (a foreign table reads through its
-- server), and it must still hold the key its updates pair on. Every read of an attached
-- table checks it in the transaction that reads, after taking the table's lock
-- (webhooks.lock_attached), and the DDL guard after each statement on it.
CREATE OR REPLACE FUNCTION webhooks.relation_problem(a webhooks.attachments) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_kind "char";
    v_part regclass;
BEGIN
    SELECT c.relkind INTO v_kind FROM pg_class c WHERE c.oid = a.table_oid;
    IF NOT FOUND THEN
        RETURN format('table %s no longer exists', a.table_oid);
    ELSIF v_kind NOT IN ('r', 'p') THEN
        RETURN format('%s is no longer a table (it is %s): the service reads nothing of it',
                      a.table_oid,
                      CASE v_kind WHEN 'v' THEN 'a view' WHEN 'm' THEN 'a materialized view'
                                  WHEN 'f' THEN 'a foreign table' ELSE 'not a table' END);
    END IF;
    IF v_kind = 'p' THEN
        SELECT t.relid INTO v_part FROM pg_partition_tree(a.table_oid) t
          JOIN pg_class c ON c.oid = t.relid
         WHERE c.relkind NOT IN ('r', 'p')
         LIMIT 1;
        IF FOUND THEN
            RETURN format('partition %s of table %s is not an ordinary table (a foreign '
                          'table reads through its server): the service reads nothing of it',
                          v_part, a.table_oid);
        END IF;
    END IF;
    IF a.key_columns IS NOT NULL
       AND webhooks.pairing_key(a.table_oid, a.id_column) IS NULL THEN
        RETURN format('table %s has no primary key or unique index that holds its id column '
                      '%I any more', a.table_oid, a.id_column);
    END IF;
    RETURN NULL;
END
$$;


-- The settings a column's value depends on on its way into the outbox: the names of the
-- five format settings the capture functions may pin (TimeZone, DateStyle, IntervalStyle,
-- extra_float_digits, bytea_output). `as_json`: the value goes through json_build_object
-- (built-in types, through domains and arrays: webhooks.json_safe_type), which writes
-- dates and timestamps in ISO 8601 whatever DateStyle says (a timestamptz's offset still
-- follows TimeZone); otherwise through its type's output function (format('%s')). A type
-- this list does not know, built in or not, depends on all five.
CREATE OR REPLACE FUNCTION webhooks.output_settings(typ oid, as_json boolean) RETURNS text[]
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c_all CONSTANT text[] :=
        ARRAY['TimeZone', 'DateStyle', 'IntervalStyle', 'extra_float_digits', 'bytea_output'];
BEGIN
    typ := webhooks.element_base_type(typ);
    RETURN CASE
        WHEN typ IN ('bool'::regtype, 'char'::regtype, 'name'::regtype, 'int2'::regtype,
                     'int4'::regtype, 'int8'::regtype, 'oid'::regtype, 'numeric'::regtype,
                     'text'::regtype, 'varchar'::regtype, 'bpchar'::regtype,
                     'uuid'::regtype, 'json'::regtype, 'jsonb'::regtype)
            THEN '{}'::text[]
        WHEN typ IN ('float4'::regtype, 'float8'::regtype) THEN ARRAY['extra_float_digits']
        WHEN typ = 'bytea'::regtype THEN ARRAY['bytea_output']
        WHEN typ = 'interval'::regtype THEN ARRAY['IntervalStyle']
        WHEN typ IN ('date'::regtype, 'timestamp'::regtype) THEN
            CASE WHEN as_json THEN '{}'::text[] ELSE ARRAY['DateStyle'] END
        WHEN typ = 'timestamptz'::regtype THEN
            CASE WHEN as_json THEN ARRAY['TimeZone'] ELSE ARRAY['TimeZone', 'DateStyle'] END
        WHEN typ IN ('time'::regtype, 'timetz'::regtype) THEN ARRAY['DateStyle']
        ELSE c_all END;
END
$$;


-- The SET clauses of an attachment's capture function: the format settings that the
-- values it captures depend on (webhooks.output_settings), pinned for the function's own
-- duration, so that one change makes the same event from any session. Each pinned
-- setting costs every captured statement (about 1.5 us on PostgreSQL 15), so a table of
-- integers and text pins none. The function is generated again whenever the table is
-- altered, so a column's new type brings its settings.
CREATE OR REPLACE FUNCTION webhooks.capture_settings(a webhooks.attachments) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_needed text[] := '{}';
    v_column record;
BEGIN
    FOR v_column IN
        -- The row's columns (an UPDATE carries them even without include_row), as JSON
        -- when built in; the id and parent as JSON; tenant, user and the pairing key as text.
        SELECT t.atttypid AS typ,
               webhooks.json_safe_type(t.atttypid)
               AND NOT coalesce(t.attname = ANY (ARRAY[a.tenant_column, a.user_column]
                                                 || coalesce(a.key_columns,
                                                             ARRAY[a.id_column])), false)
                   AS as_json
          FROM pg_attribute t
         WHERE t.attrelid = a.table_oid AND t.attnum > 0 AND NOT t.attisdropped
           AND t.attname = ANY (webhooks.row_columns(a)
                                || ARRAY[a.id_column, a.parent_column, a.tenant_column,
                                         a.user_column]::name[] || a.key_columns::name[])
    LOOP
        -- A column both in the row (as JSON) and a key or tenant (as text) counts as
        -- text: its text form needs at least what its JSON form does.
        v_needed := v_needed || webhooks.output_settings(v_column.typ, v_column.as_json);
    END LOOP;
    RETURN concat(
        CASE WHEN 'TimeZone' = ANY (v_needed) THEN 'SET "TimeZone" = ''UTC'' ' END,
        CASE WHEN 'DateStyle' = ANY (v_needed) THEN 'SET "DateStyle" = ''ISO, YMD'' ' END,
        CASE WHEN 'IntervalStyle' = ANY (v_needed)
             THEN 'SET "IntervalStyle" = ''postgres'' ' END,
        CASE WHEN 'extra_float_digits' = ANY (v_needed) THEN 'SET extra_float_digits = 1 ' END,
        CASE WHEN 'bytea_output' = ANY (v_needed) THEN 'SET bytea_output = ''hex'' ' END);
END
$$;


-- The text of the capture function of one attachment (see the privilege model above).
CREATE OR REPLACE FUNCTION webhooks.capture_source(a webhooks.attachments) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_element text;
    v_update_element text;
    v_parts text[];
    v_queue text;
    v_body text;
    v_tag text := 'capture';
    v_keys text := '';
    v_key_list text := '';
    v_join text := '';
    v_key text;
    v_n integer := 0;
    v_pairs text;
    v_update text;
BEGIN
    -- The pairing key's columns as text (their output functions: built in, or written by
    -- a superuser), so that the join runs text equality, never an operator of the
    -- column's type. NULL pairs with nothing: a unique index does not tell such rows apart.
    FOREACH v_key IN ARRAY coalesce(a.key_columns, ARRAY[a.id_column]) LOOP
        v_n := v_n + 1;
        v_keys := v_keys || format(', %s AS k%s', webhooks.column_sql(a.table_oid, v_key, true),
                                   v_n);
        v_key_list := v_key_list || format(', x.k%s', v_n);
        v_join := v_join || CASE WHEN v_n > 1 THEN ' AND ' ELSE '' END
                  || format('o.k%s OPERATOR(pg_catalog.=) n.k%s', v_n, v_n);
    END LOOP;
    -- One element per changed row: [resource_id, parent_id, tenant, user, row].
    v_parts := ARRAY[
        webhooks.column_sql(a.table_oid, a.id_column),
        CASE WHEN a.parent_column IS NULL THEN 'NULL'
             ELSE webhooks.column_sql(a.table_oid, a.parent_column) END,
        CASE WHEN a.tenant_column IS NULL THEN 'NULL'
             ELSE webhooks.column_sql(a.table_oid, a.tenant_column, true) END,
        CASE WHEN a.user_column IS NULL THEN 'NULL'
             ELSE webhooks.column_sql(a.table_oid, a.user_column, true) END];
    v_element := format('pg_catalog.json_build_array(%s, %s, %s, %s, %s)',
                        v_parts[1], v_parts[2], v_parts[3], v_parts[4],
                        CASE WHEN a.include_row THEN webhooks.row_sql(a) ELSE 'NULL' END);
    -- An UPDATE's parts, as columns i, p, t, u, r: the row is always there, even when
    -- include_row is false: fan-out names the columns that changed from it (and drops it
    -- from the payload). Nothing here parses the JSON it builds (a json column's
    -- \u0000 would fail the application's statement).
    v_update_element := format('%s AS i, %s AS p, %s AS t, %s AS u, %s AS r',
                               v_parts[1], v_parts[2], v_parts[3], v_parts[4],
                               webhooks.row_sql(a));
    -- The one statement that queues a change, from the subquery (%7$s) that gives its
    -- rows: none when they are NULL (a statement that changed no row, or no row whose
    -- captured form changed).
    -- The writer's trace context (webhooks.traceparent, webhooks.tracestate) goes along as
    -- given: the worker sends only well-formed values, so a malformed one never fails the
    -- writer's statement.
    v_queue := $q$INSERT INTO webhooks.outbox (hook_resource, name, resource, parent_resource,
                                     include_row, user_setting, role, occurred_at, rows,
                                     tenant_scoped, xid, include_previous, traceparent,
                                     tracestate)
        SELECT %1$L, v_name, %2$L, %3$L, %4$L,
               pg_catalog.current_setting('webhooks.user_id', true), session_user,
               pg_catalog.statement_timestamp(), x.rows, %5$L,
               pg_catalog.pg_current_xact_id(), %6$L,
               pg_catalog.left(pg_catalog.current_setting('webhooks.traceparent', true), 64),
               pg_catalog.left(pg_catalog.current_setting('webhooks.tracestate', true), 513)
          FROM (%7$s) x
         WHERE x.rows IS NOT NULL;$q$;
    -- An UPDATE's rows whose captured form changed, each paired with its old row on the
    -- key (a merge or hash join: at most one old row per new row, never a loop per id;
    -- no old row when a key column changed): [resource_id, parent_id, tenant, user, row,
    -- previous row].
    v_pairs := format($rows$
                SELECT n.i, n.p, n.t, n.u, n.r, o.r AS r0, o.i AS i0, o.p AS p0, o.t AS t0,
                       o.u AS u0, o.e IS NOT NULL AS paired
                  FROM (SELECT x.*,
                               pg_catalog.json_build_array(x.i, x.p, x.t, x.u, x.r)
                                   ::pg_catalog.text AS e
                          FROM (SELECT %1$s%3$s FROM changed_rows c OFFSET 0) x) n
                  LEFT JOIN (SELECT x.i, x.p, x.t, x.u, x.r%2$s,
                                    pg_catalog.json_build_array(x.i, x.p, x.t, x.u, x.r)
                                        ::pg_catalog.text AS e
                               FROM (SELECT %1$s%3$s FROM old_rows c OFFSET 0) x) o
                         ON %4$s
                 WHERE o.e IS NULL OR NOT (o.e OPERATOR(pg_catalog.=) n.e)$rows$,
                      v_update_element, v_key_list, v_keys, v_join);
    IF a.tenant_column IS NULL THEN
        v_update := format(v_queue, a.hook_resource, a.resource, a.parent_resource,
                           a.include_row, false, a.include_previous AND a.include_row,
                           format('SELECT pg_catalog.json_agg(pg_catalog.json_build_array('
                                  'u.i, u.p, u.t, u.u, u.r, u.r0)) AS rows FROM (%s) u',
                                  v_pairs));
    ELSE
        -- A row whose tenant changed left one tenant and arrived at another: tenant-scoped
        -- subscriptions get the old tenant's .delete (the row as it was) and the new
        -- tenant's .create (the row as it is), each its own outbox row with audience
        -- 'tenanted'; subscriptions without a tenant get the one .update ('untenanted'),
        -- so no event shows one tenant the other's values. Rows that stayed are queued
        -- as before. A row whose key changed pairs with no old row and stays an update
        -- of its new tenant, showing nothing of the old one.
        v_update := format($moves$INSERT INTO webhooks.outbox (hook_resource, name, resource,
                                     parent_resource, include_row, user_setting, role,
                                     occurred_at, rows, tenant_scoped, xid, include_previous,
                                     audience, traceparent, tracestate)
        SELECT %1$L, x.name, %2$L, %3$L, %4$L,
               pg_catalog.current_setting('webhooks.user_id', true), session_user,
               pg_catalog.statement_timestamp(), x.rows, true,
               pg_catalog.pg_current_xact_id(), %5$L, x.audience,
               pg_catalog.left(pg_catalog.current_setting('webhooks.traceparent', true), 64),
               pg_catalog.left(pg_catalog.current_setting('webhooks.tracestate', true), 513)
          FROM (WITH pairs AS (
                    SELECT u.*, u.paired AND NOT coalesce(u.t OPERATOR(pg_catalog.=) u.t0,
                                                          u.t IS NULL AND u.t0 IS NULL)
                               AS moved
                      FROM (%6$s) u)
                SELECT 1 AS ord, %7$L::pg_catalog.text AS name,
                       NULL::pg_catalog.text AS audience,
                       pg_catalog.json_agg(pg_catalog.json_build_array(p.i, p.p, p.t, p.u,
                                                                       p.r, p.r0))
                           FILTER (WHERE v_wanted AND NOT p.moved) AS rows
                  FROM pairs p
                UNION ALL
                SELECT 2, %7$L, 'untenanted',
                       pg_catalog.json_agg(pg_catalog.json_build_array(p.i, p.p, p.t, p.u,
                                                                       p.r, p.r0))
                           FILTER (WHERE v_wanted AND p.moved)
                  FROM pairs p
                UNION ALL
                SELECT 3, %8$L, 'tenanted',
                       pg_catalog.json_agg(pg_catalog.json_build_array(p.i0, p.p0, p.t0,
                                                                       p.u0, p.r0))
                           FILTER (WHERE p.moved)
                  FROM pairs p
                UNION ALL
                SELECT 4, %9$L, 'tenanted',
                       pg_catalog.json_agg(pg_catalog.json_build_array(p.i, p.p, p.t, p.u,
                                                                       p.r))
                           FILTER (WHERE p.moved)
                  FROM pairs p) x
         WHERE x.rows IS NOT NULL
         ORDER BY x.ord;$moves$,
            a.hook_resource, a.resource, a.parent_resource, a.include_row,
            a.include_previous AND a.include_row, v_pairs, a.noun || '.update',
            a.noun || '.delete', a.noun || '.create');
    END IF;
    v_body := format($src$
-- Generated by webhooks.install_capture for attachment %1$s: do not edit; it is written
-- again by webhooks.attach and whenever the table is altered.
DECLARE
    -- Held until commit; see webhooks.probe_lock_class.
    v_lock pg_catalog.bool := pg_catalog.pg_try_advisory_xact_lock_shared(%2$s, %3$s);
    v_name pg_catalog.text :=
        CASE WHEN TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN %4$L
             WHEN TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN %5$L
             WHEN TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN %6$L
             ELSE %11$L END;
    v_waiting pg_catalog.bool;
    -- Whether the statement's own event is wanted (a tenant-scoped table's UPDATE is
    -- probed for .create and .delete too: a row that changes tenant is one of each).
    v_wanted pg_catalog.bool := true;
BEGIN
    -- The probe: this table is the attachment's, and an active subscription wants the
    -- event; and whether a worker waits for a NOTIFY (read only when one is wanted).
    -- Each statement here is one SPI call; when nobody wants it, this is the only one
    -- (and the writer touches nothing else of the schema than the three tables it names).
    SELECT EXISTS (SELECT 1 FROM webhooks.wakeups)%14$s INTO v_waiting%15$s
      FROM webhooks.attachments a
     WHERE a.id OPERATOR(pg_catalog.=) %1$s
       AND a.table_oid OPERATOR(pg_catalog.=) TG_RELID
       AND EXISTS (SELECT 1 FROM webhooks.wanted_events w
                    WHERE w.resource OPERATOR(pg_catalog.=) %7$L
                      AND w.event OPERATOR(pg_catalog.=) %13$s
                      AND w.subscriptions OPERATOR(pg_catalog.>) 0);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- Then one statement queues the change, and a worker that waits is woken.
    IF TG_OP OPERATOR(pg_catalog.=) 'TRUNCATE' THEN
        -- One change for the statement, with no id, tenant or row: a TRUNCATE has no
        -- transition table, and names no row. The tenant column stays in force, so that
        -- fan-out gives it only to subscriptions made without a tenant (every tenant's
        -- rows went, and no one tenant's subscription speaks for them all).
        %10$s
    ELSIF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        -- Only rows whose captured form really changed, each with the row as it was
        -- (paired on the attachment's key_columns, a merge or hash join: at most one old
        -- row per new row, never a loop per id; null when a key column changed):
        -- [resource_id, parent_id, tenant, user, row, previous row]. Fan-out names the
        -- changed columns from the two, off the write path.
        %9$s
    ELSE
        -- changed_rows is NEW TABLE for INSERT, OLD TABLE for DELETE.
        %8$s
    END IF;
    -- FOUND is the INSERT's (an IF leaves it as it was): a worker is woken only when one
    -- waits (the probe read webhooks.wakeups), a row was queued and no other open
    -- transaction holds the wakeup's token (see webhooks.notify_lock_class): commits
    -- that NOTIFY serialise on a database-wide lock, so a busy system, whose workers
    -- poll the outbox anyway, sends none, and concurrent writers send one at a time.
    -- Postgres folds identical notifications of a transaction into one. The test is a
    -- plpgsql expression, and the NOTIFY runs only when it passes: the insert and the
    -- wakeups' read in one statement (a CTE) cost each captured statement 5-12 us more
    -- of the server's CPU.
    IF FOUND AND v_waiting AND pg_catalog.pg_try_advisory_xact_lock(%12$s, 0) THEN
        PERFORM pg_catalog.pg_notify('webhooks', '');
    END IF;
    RETURN NULL;
END
$src$,
        a.id, webhooks.probe_lock_class(), hashtext(a.hook_resource), a.noun || '.create',
        a.noun || '.update', a.noun || '.delete', a.hook_resource,
        -- Without the row no old row either: attachments made before attach refused the
        -- pair may still have both set.
        format(v_queue, a.hook_resource, a.resource, a.parent_resource, a.include_row,
               a.tenant_column IS NOT NULL, a.include_previous AND a.include_row,
               format('SELECT pg_catalog.json_agg(%s) AS rows FROM changed_rows c',
                      v_element)),
        v_update,
        format(v_queue, a.hook_resource, a.resource, a.parent_resource, false,
               a.tenant_column IS NOT NULL, false,
               'SELECT ''[[null, null, null, null, null]]''::pg_catalog.json AS rows'),
        a.noun || '.truncate', webhooks.notify_lock_class(),
        CASE WHEN a.tenant_column IS NULL THEN 'v_name'
             ELSE format('ANY (CASE WHEN TG_OP OPERATOR(pg_catalog.=) ''UPDATE'' '
                         'THEN ARRAY[%L, %L, %L]::pg_catalog.text[] ELSE ARRAY[v_name] END)',
                         a.noun || '.update', a.noun || '.create', a.noun || '.delete') END,
        CASE WHEN a.tenant_column IS NOT NULL THEN format(
            ', EXISTS (SELECT 1 FROM webhooks.wanted_events w'
            ' WHERE w.resource OPERATOR(pg_catalog.=) %L'
            ' AND w.event OPERATOR(pg_catalog.=) v_name'
            ' AND w.subscriptions OPERATOR(pg_catalog.>) 0)', a.hook_resource) END,
        CASE WHEN a.tenant_column IS NOT NULL THEN ', v_wanted' END);
    -- Column names and literals are quoted, but a dollar quote ends at its tag wherever
    -- it appears: pick one the body does not contain.
    WHILE position('$' || v_tag || '$' IN v_body) > 0 LOOP
        v_tag := v_tag || '_';
    END LOOP;
    -- The writer's session may say anything about how values become text (their JSON in
    -- the outbox, the text form of other types): the function sets what its columns
    -- depend on (webhooks.capture_settings), for its own duration only, so one change
    -- makes the same event from any session.
    RETURN format('CREATE OR REPLACE FUNCTION webhooks.%I() RETURNS trigger '
                  'LANGUAGE plpgsql SECURITY DEFINER %s AS $%s$%s$%s$',
                  'capture_' || a.id, webhooks.capture_settings(a), v_tag, v_body, v_tag);
END
$$;


-- Checks that every column the attachment names exists, then (re)writes the table's
-- capture function and makes sure its four triggers call it.
CREATE OR REPLACE FUNCTION webhooks.install_capture(table_name regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a webhooks.attachments;
    v_column text;
    v_function text;
    v_key text[];
    v_index regclass;
    v_problem text;
BEGIN
    SELECT * INTO a FROM webhooks.attachments x WHERE x.table_oid = install_capture.table_name;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOREACH v_column IN ARRAY
        ARRAY[a.id_column, a.parent_column, a.user_column, a.tenant_column]
        || a.exclude_columns || coalesce(a.columns, '{}')
    LOOP
        CONTINUE WHEN v_column IS NULL;
        PERFORM 1 FROM pg_attribute t
         WHERE t.attrelid = a.table_oid AND t.attname = v_column
           AND t.attnum > 0 AND NOT t.attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'webhooks: table % has no column % any more, and its attachment names it',
                a.table_oid, quote_ident(v_column)
                USING ERRCODE = 'undefined_column',
                      HINT = 'Renaming or dropping a column that webhooks.attach names (id, '
                             'parent, user, tenant, excluded or listed columns) is refused: '
                             'run webhooks.attach again without it first, or webhooks.detach.';
        END IF;
    END LOOP;

    -- Still an ordinary table with its key (webhooks.relation_problem): what the DDL guard
    -- refuses to change, and what was changed where no event trigger could refuse it.
    v_problem := webhooks.relation_problem(a);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'webhooks: %, and its attachment reads it', v_problem
            USING ERRCODE = 'invalid_table_definition',
                  HINT = 'An attached table stays an ordinary table (its partitions too), '
                         'keeps a primary key or a unique index (on columns, not partial, '
                         'not deferrable) that holds the id column, and its capture '
                         'triggers; run webhooks.detach first.';
    END IF;
    -- The pairing key is found again each time, so that it follows the table: a renamed
    -- key column, a primary key added to a table attached by an earlier version, an index
    -- rebuilt by ALTER COLUMN ... TYPE. Its index is recorded for the DDL guard.
    v_key := webhooks.pairing_key(a.table_oid, a.id_column);
    v_index := webhooks.pairing_index(a.table_oid, a.id_column);
    IF v_key IS NULL THEN
        -- Attached by an earlier version, which took a table without such a key: its
        -- updates are paired on the id alone, as they were, until it gets one.
        RAISE WARNING 'webhooks: table % has no primary key or unique index that holds its id '
                      'column %: its updates are paired by the id alone',
            a.table_oid, quote_ident(a.id_column);
    END IF;
    IF (v_key, v_index::oid) IS DISTINCT FROM (a.key_columns, a.key_index::oid) THEN
        UPDATE webhooks.attachments x SET key_columns = coalesce(v_key, x.key_columns),
                                          key_index = v_index
         WHERE x.id = a.id;
        a.key_columns := coalesce(v_key, a.key_columns);
    END IF;

    -- Tables attached before TRUNCATE was captured lack its event; every migrate passes
    -- here for each attachment.
    INSERT INTO webhooks.hook_events (resource, event, public, table_oid)
    VALUES (a.hook_resource, a.noun || '.truncate', a.public, a.table_oid)
        ON CONFLICT (resource, event) DO NOTHING;

    v_function := 'capture_' || a.id;
    EXECUTE webhooks.capture_source(a);
    EXECUTE format('REVOKE ALL ON FUNCTION webhooks.%I() FROM PUBLIC', v_function);

    IF (SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
         WHERE t.tgrelid = a.table_oid AND p.proname = v_function
           AND p.pronamespace = 'webhooks'::regnamespace
           AND t.tgname IN ('webhooks_1_insert', 'webhooks_2_update', 'webhooks_3_delete',
                            'webhooks_4_truncate')) = 4
    THEN
        RETURN;
    END IF;
    PERFORM webhooks.drop_capture_triggers(a.table_oid);
    EXECUTE format('CREATE TRIGGER webhooks_1_insert AFTER INSERT ON %s '
                   'REFERENCING NEW TABLE AS changed_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.%I()', a.table_oid, v_function);
    EXECUTE format('CREATE TRIGGER webhooks_2_update AFTER UPDATE ON %s '
                   'REFERENCING OLD TABLE AS old_rows NEW TABLE AS changed_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.%I()', a.table_oid, v_function);
    EXECUTE format('CREATE TRIGGER webhooks_3_delete AFTER DELETE ON %s '
                   'REFERENCING OLD TABLE AS changed_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.%I()', a.table_oid, v_function);
    EXECUTE format('CREATE TRIGGER webhooks_4_truncate AFTER TRUNCATE ON %s '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.%I()', a.table_oid, v_function);
END
$$;


-- What `webhooks migrate` does for each attachment: writes its capture function again, or,
-- when the table is no longer one the service may read (webhooks.relation_problem:
-- changed where no event trigger could refuse it), forgets it as DROP TABLE would, its
-- subscriptions inactive with the reason, which it returns.
CREATE OR REPLACE FUNCTION webhooks.refresh_capture(table_name regclass) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a webhooks.attachments;
    v_problem text;
BEGIN
    SELECT * INTO a FROM webhooks.attachments x WHERE x.table_oid = refresh_capture.table_name;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_problem := webhooks.relation_problem(a);
    IF v_problem IS NOT NULL THEN
        PERFORM webhooks.forget_table(a.table_oid, v_problem);
        RETURN v_problem;
    END IF;
    PERFORM webhooks.install_capture(a.table_oid);
    RETURN NULL;
END
$$;


-- Takes the lock every read of an attached table takes (ACCESS SHARE, as any SELECT:
-- only DDL waits for it, and it waits for DDL) before anything of the table is read or
-- planned, then checks what the table is now (webhooks.relation_problem): a table turned
-- into a view or given a foreign partition cannot change under the lock until the
-- reading transaction ends. NULL when the caller may read; else the reason, and the
-- attachment is forgotten as DROP TABLE would (its subscriptions inactive, saying why).
-- LOCK runs no code of the table's (of a view it locks the relations its query names).
CREATE OR REPLACE FUNCTION webhooks.lock_attached(a webhooks.attachments) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_problem text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = a.table_oid) THEN
        RETURN format('table %s no longer exists', a.table_oid);
    END IF;
    EXECUTE format('LOCK TABLE ONLY %s IN ACCESS SHARE MODE', a.table_oid);
    v_problem := webhooks.relation_problem(a);
    IF v_problem IS NOT NULL THEN
        PERFORM webhooks.forget_table(a.table_oid, v_problem);
    END IF;
    RETURN v_problem;
END
$$;


-- Drops the table's capture triggers, as the service's own DDL: the DDL guard
-- (webhooks.on_drop_guard) lets this transaction's DROP TRIGGER of them pass, by the
-- attachment's ddl_xid, which no other role can write.
CREATE OR REPLACE FUNCTION webhooks.drop_capture_triggers(table_name regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_trigger name;
BEGIN
    FOR v_trigger IN
        SELECT t.tgname FROM pg_trigger t
         WHERE t.tgrelid = drop_capture_triggers.table_name
           AND t.tgname IN ('webhooks_1_insert', 'webhooks_2_update', 'webhooks_3_delete',
                            'webhooks_4_truncate')
    LOOP
        UPDATE webhooks.attachments a SET ddl_xid = pg_current_xact_id()
         WHERE a.table_oid = drop_capture_triggers.table_name
           AND a.ddl_xid IS DISTINCT FROM pg_current_xact_id();
        EXECUTE format('DROP TRIGGER %I ON %s', v_trigger, drop_capture_triggers.table_name);
    END LOOP;
END
$$;


-- The capture of one table goes: its triggers, its attachment (and with it, by cascade,
-- its registered events) and its capture function. attach replaces settings through it.
CREATE OR REPLACE FUNCTION webhooks.drop_capture(table_name regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM webhooks.drop_capture_triggers(drop_capture.table_name);
    DELETE FROM webhooks.attachments a WHERE a.table_oid = drop_capture.table_name
    RETURNING a.id INTO v_id;
    IF v_id IS NOT NULL THEN
        EXECUTE format('DROP FUNCTION IF EXISTS webhooks.%I()', 'capture_' || v_id);
    END IF;
END
$$;


-- Stops the active subscriptions of `resource` that the registry no longer serves, saying
-- why in inactive_reason (the API, `webhooks status` and the dashboard show it):
--   * those that listen to an event now private (`hidden`), even when their other events
--     are still public: the subscription is one row, and going on with only some of its
--     events would change what its owner asked for without a word;
--   * those whose every event is gone from the registry (`gone`); one that still has an
--     event left goes on receiving it.
-- The webhook.* events of the service and any subscription that an operator makes in SQL
-- to an event already private are not touched. Re-activating is refused by the API while
-- an event is unregistered or private.
CREATE OR REPLACE FUNCTION webhooks.hold_subscriptions(resource text, gone text[],
                                                       hidden text[], why_gone text,
                                                       why_hidden text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_count bigint;
BEGIN
    UPDATE webhooks.subscriptions s
       SET active = false,
           inactive_reason = CASE
               WHEN s.events && hold_subscriptions.hidden THEN format(
                   'events %s of resource %s are no longer public (%s): nothing more is sent '
                   'to this subscription; make one without them',
                   (SELECT string_agg(DISTINCT e, ', ') FROM unnest(s.events) AS e
                     WHERE e = ANY (hold_subscriptions.hidden)),
                   s.resource, hold_subscriptions.why_hidden)
               ELSE format('events %s of resource %s are no longer sent (%s)',
                           array_to_string(s.events, ', '), s.resource,
                           hold_subscriptions.why_gone) END
     WHERE s.active AND s.resource = hold_subscriptions.resource
       AND (s.events && coalesce(hold_subscriptions.hidden, '{}')
            OR s.events <@ coalesce(hold_subscriptions.gone, '{}'));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;


-- A table leaves the service (detach, DROP TABLE): its capture goes, and the subscriptions
-- left with nothing to receive stop, saying `reason` (webhooks.hold_subscriptions).
CREATE OR REPLACE FUNCTION webhooks.forget_table(table_name regclass, reason text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_resource text;
    v_events text[];
BEGIN
    SELECT e.resource, array_agg(e.event) INTO v_resource, v_events
      FROM webhooks.hook_events e WHERE e.table_oid = forget_table.table_name
     GROUP BY e.resource;
    PERFORM webhooks.drop_capture(forget_table.table_name);
    IF v_resource IS NOT NULL THEN
        PERFORM webhooks.hold_subscriptions(v_resource, v_events, '{}', reason, NULL);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION webhooks.detach(table_name regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM webhooks.forget_table(detach.table_name,
                                  format('table %s was detached', detach.table_name));
END
$$;

COMMENT ON FUNCTION webhooks.detach(regclass) IS
    'Stops capturing changes of the table, removes its events from the registry and makes '
    'inactive the subscriptions left with no event, saying why.';


-- The columns that an attachment's rows may send, in table order.
CREATE OR REPLACE FUNCTION webhooks.sent_columns(a webhooks.attachments) RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(t.attname::text ORDER BY t.attnum), '{}')
      FROM pg_attribute t
     WHERE t.attrelid = a.table_oid AND t.attnum > 0 AND NOT t.attisdropped
       AND NOT t.attname = ANY (a.exclude_columns)
       AND (a.columns IS NULL OR t.attname = ANY (a.columns))
$$;


CREATE OR REPLACE FUNCTION webhooks.attach(
    table_name      regclass,
    resource        text,
    noun            text,
    parent_resource text DEFAULT NULL,
    parent_column   text DEFAULT NULL,
    id_column       text DEFAULT 'id',
    user_column     text DEFAULT NULL,
    tenant_column   text DEFAULT NULL,
    exclude_columns text[] DEFAULT '{}',
    include_row     boolean DEFAULT true,
    public          boolean DEFAULT true,
    columns         text[] DEFAULT NULL,
    include_previous boolean DEFAULT false
) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_hook_resource text := coalesce(attach.parent_resource, attach.resource);
    v_kind "char";
    v_column text;
    v_other regclass;
    v_key text[];
    v_old webhooks.attachments;
    v_new webhooks.attachments;
    v_old_resource text;
    v_old_events text[];
    v_old_public text[];
    v_gone text[];
    v_hidden text[];
    v_newly_sent text[];
BEGIN
    SELECT c.relkind INTO v_kind FROM pg_class c WHERE c.oid = attach.table_name;
    IF v_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'webhooks.attach: % is not a table', attach.table_name
            USING ERRCODE = 'wrong_object_type';
    END IF;

    IF attach.resource IS NULL OR attach.resource !~ '^[a-z0-9_]+$' THEN
        RAISE EXCEPTION 'webhooks.attach: resource % must be lowercase letters, digits and underscores',
            coalesce(quote_literal(attach.resource), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF attach.noun IS NULL OR attach.noun !~ '^[a-z0-9_]+$' THEN
        RAISE EXCEPTION 'webhooks.attach: noun % must be lowercase letters, digits and underscores',
            coalesce(quote_literal(attach.noun), 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF attach.parent_resource IS NOT NULL AND attach.parent_resource !~ '^[a-z0-9_]+$' THEN
        RAISE EXCEPTION 'webhooks.attach: parent_resource % must be lowercase letters, digits and underscores',
            quote_literal(attach.parent_resource) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF (attach.parent_resource IS NULL) <> (attach.parent_column IS NULL) THEN
        RAISE EXCEPTION 'webhooks.attach: parent_resource and parent_column go together: give both or neither'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF attach.id_column IS NULL THEN
        RAISE EXCEPTION 'webhooks.attach: id_column must not be NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF attach.include_row IS NULL OR attach.public IS NULL OR attach.include_previous IS NULL THEN
        RAISE EXCEPTION 'webhooks.attach: include_row, public and include_previous must be true or false'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT attach.include_row AND attach.include_previous THEN
        RAISE EXCEPTION 'webhooks.attach: include_previous => true needs include_row => true: '
                        'a table attached with include_row => false sends no row, old or new'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(attach.exclude_columns, NULL) IS NOT NULL
       OR array_position(attach.columns, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'webhooks.attach: exclude_columns and columns must not contain NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    FOREACH v_column IN ARRAY
        ARRAY[attach.id_column, attach.parent_column, attach.user_column, attach.tenant_column]
        || coalesce(attach.exclude_columns, '{}') || coalesce(attach.columns, '{}')
    LOOP
        CONTINUE WHEN v_column IS NULL;
        PERFORM 1 FROM pg_attribute
         WHERE attrelid = attach.table_name AND attname = v_column
           AND attnum > 0 AND NOT attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'webhooks.attach: table % has no column %',
                attach.table_name, quote_ident(v_column) USING ERRCODE = 'undefined_column';
        END IF;
    END LOOP;

    v_key := webhooks.pairing_key(attach.table_name, attach.id_column);
    IF v_key IS NULL THEN
        RAISE EXCEPTION 'webhooks.attach: table % has no primary key or unique index that holds '
                        'its id column %: updates pair each new row with its old row by one',
            attach.table_name, quote_ident(attach.id_column)
            USING ERRCODE = 'invalid_table_definition',
                  HINT = 'Add a primary key, or a unique index on columns (not partial, not '
                         'deferrable), that includes the id column.';
    END IF;

    SELECT a.table_oid INTO v_other FROM webhooks.attachments a
     WHERE a.resource = attach.resource AND a.table_oid <> attach.table_name;
    IF FOUND THEN
        RAISE EXCEPTION 'webhooks.attach: resource % is already attached to table %',
            quote_literal(attach.resource), v_other USING ERRCODE = 'unique_violation';
    END IF;

    SELECT e.table_oid INTO v_other FROM webhooks.hook_events e
     WHERE e.resource = v_hook_resource AND e.event LIKE attach.noun || '.%'
       AND e.table_oid <> attach.table_name
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'webhooks.attach: events %.* under resource % already belong to table %',
            attach.noun, quote_literal(v_hook_resource), v_other USING ERRCODE = 'unique_violation';
    END IF;

    -- Serialise concurrent attach/detach of the same table.
    PERFORM pg_advisory_xact_lock(hashtext('webhooks.attach'), attach.table_name::oid::integer);

    SELECT * INTO v_old FROM webhooks.attachments a WHERE a.table_oid = attach.table_name;
    SELECT e.resource, array_agg(e.event), array_agg(e.event) FILTER (WHERE e.public)
      INTO v_old_resource, v_old_events, v_old_public
      FROM webhooks.hook_events e WHERE e.table_oid = attach.table_name
     GROUP BY e.resource;

    PERFORM webhooks.drop_capture(attach.table_name);
    INSERT INTO webhooks.attachments (table_oid, resource, noun, hook_resource, parent_resource,
                                      parent_column, id_column, user_column, tenant_column,
                                      exclude_columns, include_row, public, columns,
                                      include_previous, key_columns, key_index, row_security)
    VALUES (attach.table_name, attach.resource, attach.noun, v_hook_resource,
            attach.parent_resource, attach.parent_column, attach.id_column, attach.user_column,
            attach.tenant_column, coalesce(attach.exclude_columns, '{}'), attach.include_row,
            attach.public, attach.columns, attach.include_previous, v_key,
            webhooks.pairing_index(attach.table_name, attach.id_column),
            (SELECT c.relrowsecurity FROM pg_class c WHERE c.oid = attach.table_name))
    RETURNING * INTO v_new;
    INSERT INTO webhooks.hook_events (resource, event, public, table_oid)
    SELECT v_hook_resource, attach.noun || '.' || verb, attach.public, attach.table_name
      FROM unnest(ARRAY['create', 'update', 'delete', 'truncate']) AS verb;

    PERFORM webhooks.install_capture(attach.table_name);

    -- New settings reach subscriptions at once: those left listening to events made
    -- private, or to events no longer registered, stop (webhooks.hold_subscriptions).
    IF v_old_resource IS NOT NULL THEN
        SELECT array_agg(o.event) FILTER (WHERE e.event IS NULL),
               array_agg(o.event) FILTER (WHERE NOT e.public AND o.event = ANY (v_old_public))
          INTO v_gone, v_hidden
          FROM unnest(v_old_events) AS o (event)
          LEFT JOIN webhooks.hook_events e
                 ON e.resource = v_old_resource AND e.event = o.event;
        PERFORM webhooks.hold_subscriptions(
            v_old_resource, v_gone, v_hidden,
            format('table %s was attached again under other names', attach.table_name),
            format('table %s was attached again with public => false', attach.table_name));
    END IF;

    -- A column kept back before and sent now is most likely a forgotten exclude_columns.
    IF v_old.table_oid IS NOT NULL THEN
        SELECT array_agg(c ORDER BY n) INTO v_newly_sent
          FROM unnest(webhooks.sent_columns(v_new)) WITH ORDINALITY AS x (c, n)
         WHERE NOT c = ANY (webhooks.sent_columns(v_old));
        IF v_newly_sent IS NOT NULL THEN
            RAISE NOTICE 'webhooks.attach: table % now sends column(s) %, which its previous '
                         'attachment kept back', attach.table_name, array_to_string(v_newly_sent, ', ')
                USING HINT = 'Give exclude_columns (or columns) again to keep them in the database.';
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION webhooks.attach(regclass, text, text, text, text, text, text, text, text[],
                                    boolean, boolean, text[], boolean) IS
    'Captures INSERT, UPDATE, DELETE and TRUNCATE of the table as '
    '<noun>.create/.update/.delete/.truncate events '
    'and registers them under parent_resource, else resource. Idempotent.';


-- Keeping attachments true to their tables. ALTER TABLE of an attached table rewrites its
-- capture function (new columns are sent, unless `columns` limits them) and refuses to
-- rename or drop a column the attachment names; DROP TABLE detaches.
--
-- Event triggers fire for every role's DDL, on every table, and run as the role doing it,
-- which has no rights on this schema: so both functions are SECURITY DEFINER (as the
-- service's role, which owns them). A role's DDL that touches no attached table costs one
-- lookup of webhooks.attachments by primary key per table it names, and nothing else.
-- What they run with the service's rights is this schema's own code only, on attached
-- tables only (install_capture reads the catalog and writes the capture function; it calls
-- no function, cast or operator a table's owner can define), and they cannot be called but
-- by the event triggers themselves (an event_trigger function is not callable, and EXECUTE
-- is not granted anyway).
CREATE OR REPLACE FUNCTION webhooks.on_alter_table() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    a webhooks.attachments;
BEGIN
    FOR a IN
        -- The tables altered, and the partitioned tables they are partitions of (a foreign
        -- table attached as a partition of an attached table's partition).
        SELECT x.* FROM webhooks.attachments x
         WHERE x.table_oid = ANY (ARRAY(
                   SELECT c.objid::regclass FROM pg_event_trigger_ddl_commands() c
                    WHERE c.classid = 'pg_class'::regclass
                   UNION
                   SELECT p.relid FROM pg_event_trigger_ddl_commands() c
                    CROSS JOIN LATERAL pg_partition_ancestors(c.objid::regclass) p
                    WHERE c.classid = 'pg_class'::regclass
                      AND (SELECT k.relispartition FROM pg_class k WHERE k.oid = c.objid)))
    LOOP
        IF NOT a.row_security
           AND (SELECT k.relrowsecurity FROM pg_class k WHERE k.oid = a.table_oid) THEN
            RAISE EXCEPTION 'webhooks: table % is attached, and row-level security on it would '
                            'run its policies where the service reads it', a.table_oid
                USING ERRCODE = 'invalid_table_definition',
                      HINT = 'Run webhooks.detach first, then attach it again.';
        END IF;
        PERFORM webhooks.install_capture(a.table_oid);
    END LOOP;
END
$$;

-- The DDL guard: statements on an attached table that would change what reading it runs
-- or how its rows pair are refused, with a hint to detach first: a rule (CREATE RULE
-- "_RETURN" turns an emptied table into a view on PostgreSQL 15 and older), a policy, a
-- capture trigger renamed, a foreign table made a partition of it. Statements on other
-- tables cost one lookup of webhooks.attachments and pass. Where no event trigger is
-- installed, every read checks instead (webhooks.relation_problem).
CREATE OR REPLACE FUNCTION webhooks.on_ddl_guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.command_tag, c.object_identity, a.table_oid, a.key_columns
          FROM pg_event_trigger_ddl_commands() c
          JOIN webhooks.attachments a
            ON a.table_oid = ANY (ARRAY(
                   SELECT x.ev_class FROM pg_rewrite x
                    WHERE c.classid = 'pg_rewrite'::regclass AND x.oid = c.objid
                   UNION ALL
                   SELECT x.polrelid FROM pg_policy x
                    WHERE c.classid = 'pg_policy'::regclass AND x.oid = c.objid
                   UNION ALL
                   SELECT x.tgrelid FROM pg_trigger x
                    WHERE c.classid = 'pg_trigger'::regclass AND x.oid = c.objid
                   UNION ALL
                   SELECT p.relid FROM pg_partition_ancestors(c.objid::regclass) p
                    WHERE c.classid = 'pg_class'::regclass
                      AND c.command_tag = 'CREATE FOREIGN TABLE'))
    LOOP
        CONTINUE WHEN r.command_tag = 'ALTER TRIGGER'
                  AND (SELECT count(*) FROM pg_trigger t
                        WHERE t.tgrelid = r.table_oid
                          AND t.tgname IN ('webhooks_1_insert', 'webhooks_2_update',
                                           'webhooks_3_delete', 'webhooks_4_truncate')) = 4;
        RAISE EXCEPTION 'webhooks: table % is attached: % (%) is refused, since it would '
                        'change what reading the table runs or how its rows pair',
            r.table_oid, r.command_tag, r.object_identity
            USING ERRCODE = 'invalid_table_definition',
                  HINT = 'Run webhooks.detach first (and webhooks.attach again after).';
    END LOOP;
END
$$;

-- The DDL guard's half for drops: a capture trigger dropped by anything but the service's
-- own code (webhooks.drop_capture_triggers), or the index its updates pair on, unless a
-- key made in the same transaction takes its place (a primary key replaced in one
-- ALTER TABLE). Dropping the table itself is webhooks.on_drop's.
CREATE OR REPLACE FUNCTION webhooks.on_drop_guard() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    v_index regclass;
BEGIN
    FOR r IN
        SELECT d.object_type, d.object_identity, a.*
          FROM pg_event_trigger_dropped_objects() d
          JOIN webhooks.attachments a
            ON (d.object_type = 'trigger'
                AND d.address_names[3] IN ('webhooks_1_insert', 'webhooks_2_update',
                                           'webhooks_3_delete', 'webhooks_4_truncate')
                AND a.table_oid = to_regclass(quote_ident(d.address_names[1]) || '.'
                                              || quote_ident(d.address_names[2]))
                AND a.ddl_xid IS DISTINCT FROM pg_current_xact_id())
            OR (d.object_type = 'index' AND d.objid = a.key_index::oid)
         WHERE NOT EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() t
                            WHERE t.classid = 'pg_class'::regclass AND t.objsubid = 0
                              AND t.objid = a.table_oid::oid)
    LOOP
        IF r.object_type = 'index' THEN
            -- A column dropped with it: webhooks.install_capture judges that at the
            -- statement's end (a named column, or the key, gone is refused there).
            CONTINUE WHEN EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() t
                                   WHERE t.object_type = 'table column'
                                     AND t.objid = r.table_oid::oid);
            v_index := webhooks.pairing_index(r.table_oid, r.id_column);
            CONTINUE WHEN (SELECT x.xmin::text = (pg_current_xact_id()::xid)::text
                             FROM pg_class x WHERE x.oid = v_index);
        END IF;
        RAISE EXCEPTION 'webhooks: table % is attached: dropping % % is refused, since it '
                        'would change what reading the table runs or how its rows pair',
            r.table_oid, r.object_type, r.object_identity
            USING ERRCODE = 'invalid_table_definition',
                  HINT = 'Run webhooks.detach first (and webhooks.attach again after); a '
                         'primary key may be replaced in the statement or transaction that '
                         'drops it.';
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION webhooks.on_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        -- The attachments are found by primary key (a DROP of other tables costs one probe).
        SELECT a.table_oid, d.object_identity FROM webhooks.attachments a
          JOIN pg_event_trigger_dropped_objects() d
            ON d.classid = 'pg_class'::regclass AND d.objsubid = 0
           AND d.objid = a.table_oid::oid
         WHERE a.table_oid = ANY (ARRAY(SELECT x.objid::regclass
                                           FROM pg_event_trigger_dropped_objects() x
                                          WHERE x.classid = 'pg_class'::regclass
                                            AND x.objsubid = 0))
    LOOP
        -- As webhooks.detach, naming the table by the name it had.
        PERFORM webhooks.forget_table(r.table_oid,
                                      format('table %s was dropped', r.object_identity));
    END LOOP;
END
$$;

-- Event triggers need a superuser. Without them (a migration role that is not one), a
-- renamed or dropped column of an attached table makes its writes fail until
-- webhooks.attach is run again, and a dropped table leaves its attachment behind.
DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RAISE WARNING 'webhooks: not a superuser, so no event triggers: after renaming or '
                      'dropping a column of an attached table, run webhooks.attach again';
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger
                    WHERE evtname = 'webhooks_alter_table') THEN
        CREATE EVENT TRIGGER webhooks_alter_table ON ddl_command_end
            WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION webhooks.on_alter_table();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger
                    WHERE evtname = 'webhooks_drop') THEN
        CREATE EVENT TRIGGER webhooks_drop ON sql_drop
            WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')
            EXECUTE FUNCTION webhooks.on_drop();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger
                    WHERE evtname = 'webhooks_guard') THEN
        CREATE EVENT TRIGGER webhooks_guard ON ddl_command_end
            WHEN TAG IN ('CREATE RULE', 'CREATE POLICY', 'ALTER POLICY', 'ALTER TRIGGER',
                         'CREATE FOREIGN TABLE')
            EXECUTE FUNCTION webhooks.on_ddl_guard();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger
                    WHERE evtname = 'webhooks_drop_guard') THEN
        CREATE EVENT TRIGGER webhooks_drop_guard ON sql_drop
            WHEN TAG IN ('DROP TRIGGER', 'DROP INDEX', 'ALTER TABLE')
            EXECUTE FUNCTION webhooks.on_drop_guard();
    END IF;
END
$$;


-- The registry of what active subscriptions want (webhooks.subscription_events, and its
-- counts per event in webhooks.wanted_events), kept exact by every write to
-- webhooks.subscriptions, whoever makes it (API, CLI or SQL). A row says only whether its
-- subscription has a filter: the filter itself is stored once, with the subscription
-- (a copy per event multiplied an owner's filter bytes by its events).
CREATE OR REPLACE FUNCTION webhooks.subscription_activated() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.active_since := pg_current_snapshot();
    RETURN NEW;
END
$$;

-- Statement-level, with transition tables: a statement that writes 100,000 subscriptions
-- adjusts each count of webhooks.wanted_events once (row by row, every row of one
-- transaction would add a version of the same count row, and each would walk them all).
-- `gone` holds the rows as they were (UPDATE, DELETE), `came` as they are (INSERT, UPDATE).
CREATE OR REPLACE FUNCTION webhooks.subscription_registry() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_changed bigint[];
    v_resources text[];
    v_events text[];
BEGIN
    IF TG_OP = 'UPDATE' THEN
        -- Most updates (the worker's last_* fields) change nothing the registry holds.
        SELECT array_agg(o.id) INTO v_changed
          FROM gone o JOIN came n ON n.id = o.id
         WHERE (o.active, o.events, o.resource, o.tenant, o.active_since::text,
                o.filter_path IS NULL)
               IS DISTINCT FROM (n.active, n.events, n.resource, n.tenant, n.active_since::text,
                                 n.filter_path IS NULL);
        IF v_changed IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;
    -- The count rows this statement changes, taken in one order (resource, event) before
    -- any is changed: concurrent writes to subscriptions of the same events (activations
    -- settling together) would otherwise update them in whatever order each one's join met
    -- them, and deadlock. Missing rows are made first, in the same order (an uncommitted
    -- row is not there to lock); the rows of `gone` exist: they were counted.
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        SELECT array_agg(n.resource), array_agg(x) INTO v_resources, v_events
          FROM came n CROSS JOIN LATERAL unnest(n.events) AS x
         WHERE n.active AND (v_changed IS NULL OR n.id = ANY (v_changed));
        INSERT INTO webhooks.wanted_events (resource, event, subscriptions)
        SELECT DISTINCT k.resource, k.event, 0
          FROM unnest(v_resources, v_events) AS k (resource, event)
         ORDER BY k.resource, k.event
            ON CONFLICT (resource, event) DO NOTHING;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        SELECT coalesce(v_resources, '{}') || array_agg(o.resource),
               coalesce(v_events, '{}') || array_agg(x)
          INTO v_resources, v_events
          FROM gone o CROSS JOIN LATERAL unnest(o.events) AS x
         WHERE o.active AND (v_changed IS NULL OR o.id = ANY (v_changed));
    END IF;
    PERFORM 1 FROM webhooks.wanted_events w
     WHERE (w.resource, w.event) IN (SELECT k.resource, k.event
                                       FROM unnest(v_resources, v_events) AS k (resource, event))
     ORDER BY w.resource, w.event
       FOR UPDATE OF w;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        WITH unwanted AS (
            SELECT o.id, e.event, o.resource
              FROM gone o
             CROSS JOIN LATERAL (SELECT DISTINCT x AS event FROM unnest(o.events) AS x) e
             WHERE o.active AND (v_changed IS NULL OR o.id = ANY (v_changed))
        ), removed AS (
            DELETE FROM webhooks.subscription_events s USING unwanted u
             WHERE s.subscription_id = u.id AND s.event = u.event
        )
        UPDATE webhooks.wanted_events w SET subscriptions = w.subscriptions - c.n
          FROM (SELECT u.resource, u.event, count(*) AS n FROM unwanted u
                 GROUP BY u.resource, u.event) c
         WHERE w.resource = c.resource AND w.event = c.event;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        WITH wants AS (
            SELECT n.id, e.event, n.resource, n.tenant, n.active_since,
                   n.filter_path IS NOT NULL AS filtered
              FROM came n
             CROSS JOIN LATERAL (SELECT DISTINCT x AS event FROM unnest(n.events) AS x) e
             WHERE n.active AND (v_changed IS NULL OR n.id = ANY (v_changed))
        ), added AS (
            INSERT INTO webhooks.subscription_events (subscription_id, event, resource,
                                                      tenant, active_since, filtered)
            SELECT w2.id, w2.event, w2.resource, w2.tenant, w2.active_since, w2.filtered
              FROM wants w2
        )
        INSERT INTO webhooks.wanted_events AS w (resource, event, subscriptions)
        SELECT w2.resource, w2.event, count(*) FROM wants w2 GROUP BY w2.resource, w2.event
            ON CONFLICT (resource, event) DO UPDATE
           SET subscriptions = w.subscriptions + excluded.subscriptions;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS subscriptions_1_activated ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_1_activated BEFORE UPDATE ON webhooks.subscriptions
    FOR EACH ROW WHEN (NEW.active AND NOT OLD.active)
    EXECUTE FUNCTION webhooks.subscription_activated();
DROP TRIGGER IF EXISTS subscriptions_2_registry_insert ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_2_registry_insert AFTER INSERT ON webhooks.subscriptions
    REFERENCING NEW TABLE AS came
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks.subscription_registry();
DROP TRIGGER IF EXISTS subscriptions_3_registry_update ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_3_registry_update AFTER UPDATE ON webhooks.subscriptions
    REFERENCING OLD TABLE AS gone NEW TABLE AS came
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks.subscription_registry();
DROP TRIGGER IF EXISTS subscriptions_4_registry_delete ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_4_registry_delete AFTER DELETE ON webhooks.subscriptions
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks.subscription_registry();


-- Settling a subscription that was just made active (created or re-activated, committed):
-- the transactions whose capture probe may have run before the subscription could be seen
-- are the ones holding the probe lock of its resource now. Their changes count as before
-- the subscription; once they have ended (or the wait timed out), its start moves to now,
-- and every later change is captured for it.
--
-- webhooks.settle_waiting never waits: it returns the virtual transaction ids of those
-- writers (only those still among `among`, the previous answer, when given), '{}' when
-- none is left, NULL when the subscription is not active. The API calls it every few
-- milliseconds from Python, holding no connection between calls, so that subscriptions
-- waiting for a long application transaction never take the connections other requests
-- need; then webhooks.settle_start.
CREATE OR REPLACE FUNCTION webhooks.settle_waiting(subscription_id bigint,
                                                   among text[] DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_resource text;
BEGIN
    SELECT s.resource INTO v_resource FROM webhooks.subscriptions s
     WHERE s.id = settle_waiting.subscription_id AND s.active;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(
        (SELECT array_agg(l.virtualtransaction)
           FROM pg_locks l
          WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
            AND l.database = (SELECT d.oid FROM pg_database d
                               WHERE d.datname = current_database())
            AND l.classid = webhooks.probe_lock_class()::oid
            AND l.objid = hashtext(v_resource)::oid AND l.objsubid = 2
            AND (settle_waiting.among IS NULL
                 OR l.virtualtransaction = ANY (settle_waiting.among))),
        '{}');
END
$$;

-- Starts a settled subscription now; false when it is not active.
CREATE OR REPLACE FUNCTION webhooks.settle_start(subscription_id bigint) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE webhooks.subscriptions s SET active_since = pg_current_snapshot()
     WHERE s.id = settle_start.subscription_id AND s.active;
    RETURN FOUND;
END
$$;

-- Both steps in one call, waiting (up to `timeout`) inside it, for a DBA or a script that
-- activates a subscription in SQL; true when no such writer was left. It holds its
-- connection while it waits: the API polls webhooks.settle_waiting instead.
CREATE OR REPLACE FUNCTION webhooks.settle_subscription(subscription_id bigint,
                                                        timeout interval DEFAULT '5s')
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_waiting text[];
    v_deadline timestamptz := clock_timestamp() + settle_subscription.timeout;
BEGIN
    LOOP
        v_waiting := webhooks.settle_waiting(settle_subscription.subscription_id, v_waiting);
        IF v_waiting IS NULL THEN
            RETURN false;
        END IF;
        EXIT WHEN v_waiting = '{}' OR clock_timestamp() >= v_deadline;
        PERFORM pg_sleep(0.005);
    END LOOP;
    PERFORM webhooks.settle_start(settle_subscription.subscription_id);
    RETURN v_waiting = '{}';
END
$$;


-- No function of the schema is anyone's to call but its owner's and the roles it grants.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA webhooks REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
