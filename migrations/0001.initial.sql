-- 0001: the initial webhooks schema. Frozen: change the schema with a new migration.

-- The tables of the webhooks schema, as they stand after every migration.
-- tests/test_schema.py builds one database from this file plus sql/triggers/capture.sql
-- and another from migrations/, and fails if their schemas differ.

CREATE SCHEMA IF NOT EXISTS webhooks;

-- API tokens: only a SHA-256 of the token is stored. Tokens are 256-bit random
-- strings, so a fast hash is enough; a slow KDF would only slow every request.
CREATE TABLE webhooks.tokens (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner       text NOT NULL CHECK (owner <> ''),
    tenant      text CHECK (tenant <> ''),
    token_hash  bytea NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- One row per table whose changes are captured (written by webhooks.attach).
CREATE TABLE webhooks.attachments (
    table_oid       regclass PRIMARY KEY,
    resource        text NOT NULL UNIQUE,
    noun            text NOT NULL,
    hook_resource   text NOT NULL,  -- parent_resource when nested, else resource
    parent_resource text,
    parent_column   text,
    id_column       text NOT NULL,
    user_column     text,
    tenant_column   text,
    exclude_columns text[] NOT NULL DEFAULT '{}',
    include_row     boolean NOT NULL,
    public          boolean NOT NULL,
    attached_at     timestamptz NOT NULL DEFAULT now()
);

-- The hook-events registry: what integrators may subscribe to, per resource.
CREATE TABLE webhooks.hook_events (
    resource   text NOT NULL,
    event      text NOT NULL,
    public     boolean NOT NULL,
    table_oid  regclass NOT NULL REFERENCES webhooks.attachments (table_oid) ON DELETE CASCADE,
    PRIMARY KEY (resource, event)
);

CREATE TABLE webhooks.subscriptions (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner                text NOT NULL,
    tenant               text,
    resource             text NOT NULL,
    events               text[] NOT NULL CHECK (cardinality(events) > 0),
    target               text NOT NULL,
    secret               text NOT NULL,
    active               boolean NOT NULL DEFAULT true,
    created_at           timestamptz NOT NULL DEFAULT now(),
    last_status          integer,
    last_success_at      timestamptz,
    last_failure_at      timestamptz,
    last_failure_content text
);
CREATE INDEX subscriptions_owner_idx ON webhooks.subscriptions (owner, id);
-- The capture triggers probe this index to skip events nobody wants.
CREATE INDEX subscriptions_active_resource_idx ON webhooks.subscriptions (resource)
    WHERE active;

-- Captured changes waiting for fan-out: one row per statement that changed an attached
-- table, written by the capture trigger in the writing transaction, with the changed rows
-- as one JSON array. Turning them into per-row JSONB, extracting ids, tenants and users,
-- and dropping excluded columns all happen at fan-out, in the worker, off the write path
-- (webhooks.outbox_changes shows the pending changes one row each).
CREATE TABLE webhooks.outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hook_resource   text NOT NULL,
    name            text NOT NULL,
    resource        text NOT NULL,
    id_column       text NOT NULL,
    parent_resource text,
    parent_column   text,
    user_column     text,
    tenant_column   text,
    exclude_columns text[] NOT NULL,
    include_row     boolean NOT NULL,
    user_setting    text,           -- webhooks.user_id of the writing transaction
    role            text NOT NULL,  -- session_user of the writing transaction
    occurred_at     timestamptz NOT NULL,
    rows            json NOT NULL
);

-- Workers waiting for work, one row per worker's LISTEN connection (its backend pid).
-- The capture trigger sends NOTIFY only while a row exists; a worker busy with a backlog
-- removes its row, and rows of connections that are gone are cleaned up by the workers.
CREATE TABLE webhooks.wakeups (
    pid       integer PRIMARY KEY,
    armed_at  timestamptz NOT NULL DEFAULT now()
);

-- Events that at least one subscription wanted, with the delivery body built once.
-- Ids come from webhooks.event_ids at fan-out, in capture order.
CREATE SEQUENCE webhooks.event_ids;
CREATE TABLE webhooks.events (
    id              bigint PRIMARY KEY,
    hook_resource   text NOT NULL,
    name            text NOT NULL,
    tenant          text,
    occurred_at     timestamptz NOT NULL,
    body            text NOT NULL
);

-- The delivery queue: one row per event and subscription.
-- status: pending (due at next_attempt_at; while claimed, next_attempt_at is the lease
-- expiry, so a crashed worker's claim comes due again by itself), succeeded, failed.
CREATE TABLE webhooks.deliveries (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id         bigint NOT NULL REFERENCES webhooks.events (id) ON DELETE CASCADE,
    subscription_id  bigint NOT NULL REFERENCES webhooks.subscriptions (id) ON DELETE CASCADE,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'succeeded', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
);
CREATE INDEX deliveries_due_idx ON webhooks.deliveries (next_attempt_at, id)
    WHERE status = 'pending';
CREATE INDEX deliveries_subscription_idx ON webhooks.deliveries (subscription_id);
CREATE INDEX deliveries_event_idx ON webhooks.deliveries (event_id);
CREATE INDEX deliveries_finished_idx ON webhooks.deliveries (finished_at)
    WHERE status <> 'pending';

-- One row per HTTP attempt, for inspection and for `webhooks status`.
CREATE TABLE webhooks.attempts (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id      bigint NOT NULL REFERENCES webhooks.deliveries (id) ON DELETE CASCADE,
    subscription_id  bigint NOT NULL,
    attempt          integer NOT NULL,
    attempted_at     timestamptz NOT NULL,
    status           integer NOT NULL,  -- HTTP status, 0 when no response came
    duration_ms      double precision NOT NULL,
    error            text
);
CREATE INDEX attempts_delivery_idx ON webhooks.attempts (delivery_id);
CREATE INDEX attempts_time_idx ON webhooks.attempts (attempted_at);

-- A subscription as the REST API returns it (SPEC section 4): the API sends this text as
-- is, so the JSON is built once, here. RFC 3339 UTC timestamps with microseconds.
CREATE FUNCTION webhooks.subscription_json(s webhooks.subscriptions) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT json_build_object(
        'id', s.id,
        'resource', s.resource,
        'events', array_to_string(s.events, ','),
        'target', s.target,
        'active', s.active,
        'last_status', s.last_status,
        'last_success_at', to_char(s.last_success_at AT TIME ZONE 'UTC',
                                   'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'last_failure_at', to_char(s.last_failure_at AT TIME ZONE 'UTC',
                                   'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'last_failure_content', s.last_failure_content)::text
$$;

-- Change capture: webhooks.attach / webhooks.detach and the trigger function they install.
--
-- Three statement-level AFTER triggers per attached table, each with a transition table,
-- so a 100-row INSERT runs the function once, not 100 times. Everything the function needs
-- is passed as trigger arguments by attach(), so the hot path does no catalogue lookup and
-- no dynamic SQL; the only query it runs before writing is an index probe that skips the
-- write when no active subscription wants the event.

-- SECURITY DEFINER: application roles need no privileges on the webhooks schema to write
-- to an attached table; user_id falls back to session_user, the role that logged in.
--
-- The function sets no search_path: on PostgreSQL 15 a per-call SET search_path cost about
-- 65 us per statement (plans are revalidated on every path change), several times the rest
-- of the function. Instead every function, operator and type below is schema-qualified, so
-- a caller's search_path cannot substitute objects of its own in a definer context.
CREATE OR REPLACE FUNCTION webhooks.capture() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    -- TG_ARGV, as written by webhooks.attach:
    -- 0 hook_resource, 1 noun, 2 resource, 3 id_column, 4 parent_resource,
    -- 5 parent_column, 6 user_column, 7 tenant_column, 8 exclude_columns, 9 include_row
    v_name pg_catalog.text := TG_ARGV[1] OPERATOR(pg_catalog.||)
        CASE WHEN TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN '.create'
             WHEN TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN '.update'
             ELSE '.delete' END;
    v_rows pg_catalog.json;
BEGIN
    -- Each statement here is one SPI call, a few microseconds each; when no active
    -- subscription wants the event, the index probe is the only one.
    PERFORM 1 FROM webhooks.subscriptions s
     WHERE s.active AND s.resource OPERATOR(pg_catalog.=) TG_ARGV[0]
       AND v_name OPERATOR(pg_catalog.=) ANY (s.events)
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'UPDATE' THEN
        -- Only rows that really changed: an UPDATE that rewrites a row with the same
        -- values produces no event.
        SELECT pg_catalog.json_agg(c.j) INTO v_rows
          FROM (SELECT pg_catalog.to_jsonb(r) AS j FROM changed_rows r
                EXCEPT ALL
                SELECT pg_catalog.to_jsonb(r) FROM old_rows r) c;
        IF v_rows IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;

    -- changed_rows is NEW TABLE for INSERT and UPDATE, OLD TABLE for DELETE (see attach).
    -- json_agg writes the rows as text, in statement order, at about half the cost of
    -- building JSONB per row; the worker parses them at fan-out.
    INSERT INTO webhooks.outbox (hook_resource, name, resource, id_column, parent_resource,
                                 parent_column, user_column, tenant_column, exclude_columns,
                                 include_row, user_setting, role, occurred_at, rows)
    SELECT TG_ARGV[0], v_name, TG_ARGV[2], TG_ARGV[3],
           CASE WHEN TG_ARGV[4] OPERATOR(pg_catalog.<>) '' THEN TG_ARGV[4] END,
           CASE WHEN TG_ARGV[5] OPERATOR(pg_catalog.<>) '' THEN TG_ARGV[5] END,
           CASE WHEN TG_ARGV[6] OPERATOR(pg_catalog.<>) '' THEN TG_ARGV[6] END,
           CASE WHEN TG_ARGV[7] OPERATOR(pg_catalog.<>) '' THEN TG_ARGV[7] END,
           TG_ARGV[8]::pg_catalog.text[], TG_ARGV[9]::pg_catalog.bool,
           pg_catalog.current_setting('webhooks.user_id', true),
           session_user::pg_catalog.text, pg_catalog.statement_timestamp(), x.rows
      FROM (SELECT coalesce(v_rows, (SELECT pg_catalog.json_agg(r) FROM changed_rows r))
                   AS rows) x
     WHERE x.rows IS NOT NULL;  -- a statement that changed no row

    -- Wake a worker only when one waits (webhooks.wakeups): commits that NOTIFY serialise
    -- on a database-wide lock, so a busy system, whose workers poll the outbox anyway,
    -- sends none. Postgres folds identical notifications of a transaction into one,
    -- delivered at commit; the payload carries no row data.
    IF FOUND THEN
        PERFORM pg_catalog.pg_notify('webhooks', '') FROM webhooks.wakeups LIMIT 1;
    END IF;
    RETURN NULL;
END
$$;


-- The changes of one outbox row, one row each, as they are delivered: the row as JSONB
-- without its excluded columns (NULL when the table is attached with include_row false),
-- its id, parent id, tenant and user_id (the transaction's webhooks.user_id unless empty,
-- else the user column, else the role).
CREATE OR REPLACE FUNCTION webhooks.changes(o webhooks.outbox)
RETURNS TABLE (n bigint, resource_id jsonb, parent_id jsonb, user_id text,
               tenant_scoped boolean, tenant text, row_data jsonb)
LANGUAGE sql STABLE AS $$
    SELECT e.n,
           coalesce(e.j -> o.id_column, 'null'::jsonb),
           CASE WHEN o.parent_column IS NOT NULL
                THEN coalesce(e.j -> o.parent_column, 'null'::jsonb) END,
           coalesce(nullif(o.user_setting, ''), e.j ->> o.user_column, o.role),
           o.tenant_column IS NOT NULL,
           e.j ->> o.tenant_column,
           CASE WHEN o.include_row THEN e.j - o.exclude_columns END
      FROM (SELECT x.j::jsonb AS j, x.n
              FROM json_array_elements(o.rows) WITH ORDINALITY AS x (j, n)) e
$$;


-- What is waiting for fan-out, one change a row, in capture order.
CREATE OR REPLACE VIEW webhooks.outbox_changes AS
SELECT o.id AS outbox_id, c.n, o.hook_resource, o.name, o.resource, c.resource_id,
       o.parent_resource, c.parent_id, c.user_id, c.tenant_scoped, c.tenant, o.occurred_at,
       c.row_data
  FROM webhooks.outbox o
 CROSS JOIN LATERAL webhooks.changes(o) c;


CREATE OR REPLACE FUNCTION webhooks.drop_capture_triggers(table_name regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_trigger name;
BEGIN
    FOR v_trigger IN
        SELECT t.tgname FROM pg_trigger t
         WHERE t.tgrelid = drop_capture_triggers.table_name
           AND t.tgname IN ('webhooks_1_insert', 'webhooks_2_update', 'webhooks_3_delete')
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', v_trigger, drop_capture_triggers.table_name);
    END LOOP;
END
$$;


CREATE OR REPLACE FUNCTION webhooks.detach(table_name regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM webhooks.drop_capture_triggers(detach.table_name);
    DELETE FROM webhooks.attachments a WHERE a.table_oid = detach.table_name;
END
$$;

COMMENT ON FUNCTION webhooks.detach(regclass) IS
    'Stops capturing changes of the table and removes its events from the registry.';


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
    public          boolean DEFAULT true
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_hook_resource text := coalesce(attach.parent_resource, attach.resource);
    v_kind "char";
    v_column text;
    v_other regclass;
    v_args text;
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
    IF attach.include_row IS NULL OR attach.public IS NULL THEN
        RAISE EXCEPTION 'webhooks.attach: include_row and public must be true or false'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    FOREACH v_column IN ARRAY
        ARRAY[attach.id_column, attach.parent_column, attach.user_column, attach.tenant_column]
        || coalesce(attach.exclude_columns, '{}')
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

    DELETE FROM webhooks.attachments a WHERE a.table_oid = attach.table_name;
    INSERT INTO webhooks.attachments (table_oid, resource, noun, hook_resource, parent_resource,
                                      parent_column, id_column, user_column, tenant_column,
                                      exclude_columns, include_row, public)
    VALUES (attach.table_name, attach.resource, attach.noun, v_hook_resource,
            attach.parent_resource, attach.parent_column, attach.id_column, attach.user_column,
            attach.tenant_column, coalesce(attach.exclude_columns, '{}'), attach.include_row,
            attach.public);
    INSERT INTO webhooks.hook_events (resource, event, public, table_oid)
    SELECT v_hook_resource, attach.noun || '.' || verb, attach.public, attach.table_name
      FROM unnest(ARRAY['create', 'update', 'delete']) AS verb;

    v_args := format('%L, %L, %L, %L, %L, %L, %L, %L, %L, %L',
                     v_hook_resource, attach.noun, attach.resource, attach.id_column,
                     coalesce(attach.parent_resource, ''), coalesce(attach.parent_column, ''),
                     coalesce(attach.user_column, ''), coalesce(attach.tenant_column, ''),
                     coalesce(attach.exclude_columns, '{}')::text, attach.include_row::text);

    PERFORM webhooks.drop_capture_triggers(attach.table_name);
    EXECUTE format('CREATE TRIGGER webhooks_1_insert AFTER INSERT ON %s '
                   'REFERENCING NEW TABLE AS changed_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.capture(%s)',
                   attach.table_name, v_args);
    EXECUTE format('CREATE TRIGGER webhooks_2_update AFTER UPDATE ON %s '
                   'REFERENCING OLD TABLE AS old_rows NEW TABLE AS changed_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.capture(%s)',
                   attach.table_name, v_args);
    EXECUTE format('CREATE TRIGGER webhooks_3_delete AFTER DELETE ON %s '
                   'REFERENCING OLD TABLE AS changed_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.capture(%s)',
                   attach.table_name, v_args);
END
$$;

COMMENT ON FUNCTION webhooks.attach(regclass, text, text, text, text, text, text, text, text[],
                                    boolean, boolean) IS
    'Captures INSERT, UPDATE and DELETE of the table as <noun>.create/.update/.delete events '
    'and registers them under parent_resource, else resource. Idempotent.';
