-- The tables of the webhooks schema, as they stand after every migration.
-- tests/test_schema.py builds one database from this file plus sql/triggers/capture.sql
-- and sql/fanout.sql, and another from migrations/, and fails if their schemas differ.

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

-- One row per table whose changes are captured (written by webhooks.attach). Everything
-- a captured change is (resource, noun, tenant, columns) comes from here: the capture
-- function of a table is generated from its row (webhooks.install_capture), never from
-- trigger arguments.
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
    attached_at     timestamptz NOT NULL DEFAULT now(),
    id              bigint GENERATED ALWAYS AS IDENTITY UNIQUE,  -- names its capture function
    columns         text[],  -- allow-list: only these are sent (NULL: every column)
    include_previous boolean NOT NULL DEFAULT false  -- .update payloads carry `previous`
);

-- The hook-events registry: what integrators may subscribe to, per resource.
CREATE TABLE webhooks.hook_events (
    resource   text NOT NULL,
    event      text NOT NULL,
    public     boolean NOT NULL,
    -- The attached table whose events these are; NULL for the service's own operational
    -- events under resource `webhooks` (sql/lifecycle.sql).
    table_oid  regclass REFERENCES webhooks.attachments (table_oid) ON DELETE CASCADE,
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
    last_failure_content text,
    -- The snapshot of the transaction that last made the subscription active: changes of
    -- transactions it sees as committed happened before, and are never delivered to it.
    active_since         pg_snapshot NOT NULL DEFAULT pg_current_snapshot(),
    -- The failure lifecycle (sql/lifecycle.sql): the first failed attempt after the last
    -- success (NULL while healthy); when webhook.failing was queued for that episode; the
    -- first success after it, until webhook.recovered is queued; when the subscription was
    -- disabled automatically (NULL again once re-activated).
    failing_since        timestamptz,
    failing_notified_at  timestamptz,
    recovered_at         timestamptz,
    disabled_at          timestamptz,
    -- Secret rotation: the secret before the last rotation (sealed like `secret`), which
    -- also signs deliveries until previous_secret_expires_at.
    previous_secret             text,
    previous_secret_expires_at  timestamptz,
    -- SPEC section 9: the filter as the integrator sent it (NULL: none), and compiled to
    -- the SQL/JSON path that fan-out evaluates (webhooks.filter_passes).
    filter                      jsonb,
    filter_path                 jsonpath,
    -- SPEC section 10: strict is one delivery in flight at a time, in event order.
    ordering                    text NOT NULL DEFAULT 'unordered'
                                CHECK (ordering IN ('unordered', 'strict'))
);
CREATE INDEX subscriptions_owner_idx ON webhooks.subscriptions (owner, id);
-- The strict subscriptions, whose first pending delivery each claim looks up.
CREATE INDEX subscriptions_strict_idx ON webhooks.subscriptions (id)
    WHERE ordering = 'strict';
-- What webhooks.lifecycle() looks for every few seconds: partial indexes, empty while every
-- target is healthy.
CREATE INDEX subscriptions_failing_idx ON webhooks.subscriptions (failing_since)
    WHERE active AND failing_since IS NOT NULL;
CREATE INDEX subscriptions_failing_unnoticed_idx ON webhooks.subscriptions (failing_since)
    WHERE active AND failing_since IS NOT NULL AND failing_notified_at IS NULL;
CREATE INDEX subscriptions_recovered_idx ON webhooks.subscriptions (id)
    WHERE recovered_at IS NOT NULL;
CREATE INDEX subscriptions_previous_secret_idx
    ON webhooks.subscriptions (previous_secret_expires_at)
    WHERE previous_secret_expires_at IS NOT NULL;

-- What active subscriptions want, one row per (subscription, event), kept exact by the
-- triggers on webhooks.subscriptions. The capture probe ("does anyone want this event")
-- and fan-out's matching are index lookups here, whatever the number of subscriptions.
CREATE TABLE webhooks.subscription_events (
    subscription_id  bigint NOT NULL REFERENCES webhooks.subscriptions (id) ON DELETE CASCADE,
    event            text NOT NULL,
    resource         text NOT NULL,
    tenant           text,
    active_since     pg_snapshot NOT NULL,
    filter_path      jsonpath,  -- the subscription's, copied: fan-out reads only this table
    PRIMARY KEY (subscription_id, event)
);
CREATE INDEX subscription_events_match_idx
    ON webhooks.subscription_events (resource, event, tenant);

-- How many active subscriptions want each (resource, event): what the capture probe reads.
-- One row per pair, so the probe is a primary-key lookup whatever the plan and however
-- many subscriptions want other events of the resource.
CREATE TABLE webhooks.wanted_events (
    resource       text NOT NULL,
    event          text NOT NULL,
    subscriptions  integer NOT NULL CHECK (subscriptions >= 0),
    PRIMARY KEY (resource, event)
);

-- Captured changes waiting for fan-out: one row per statement that changed an attached
-- table, written by the table's capture function in the writing transaction. `rows` is a
-- JSON array with one element per changed row, [resource_id, parent_id, tenant, user, row]:
-- ids and the row as JSON, tenant and user as text, the row already limited to the
-- columns that may leave the database (NULL when the table is attached with include_row
-- false). An UPDATE's elements add the row as it was, [..., row, previous row], and always
-- carry the row (fan-out names the changed columns from the two, and drops the row from
-- payloads when include_row is false). Turning them into JSONB and building delivery
-- bodies happen at fan-out, in the
-- worker, off the write path (webhooks.outbox_changes shows one change a row).
CREATE TABLE webhooks.outbox (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hook_resource   text NOT NULL,
    name            text NOT NULL,
    resource        text NOT NULL,
    parent_resource text,
    include_row     boolean NOT NULL,
    user_setting    text,           -- webhooks.user_id of the writing transaction
    role            text NOT NULL,  -- session_user of the writing transaction
    occurred_at     timestamptz NOT NULL,
    rows            json NOT NULL,
    tenant_scoped   boolean NOT NULL DEFAULT false,
    xid             xid8,           -- the writing transaction (NULL for rows captured by 0001)
    include_previous boolean NOT NULL DEFAULT false
);

-- Changes that could not become events (a json value PostgreSQL cannot convert to jsonb,
-- say), set aside by fan-out with the reason instead of blocking the queue.
-- `webhooks status` shows them.
CREATE TABLE webhooks.rejected_changes (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    table_name    text NOT NULL,
    event         text NOT NULL,
    reason        text NOT NULL,
    set_aside_at  timestamptz NOT NULL DEFAULT now(),
    row_text      text  -- the captured change as text, cut to 64 KiB
);

-- Workers waiting for work, one row per worker's LISTEN connection (its backend pid).
-- The capture trigger sends NOTIFY only while a row exists; a worker busy with a backlog
-- removes its row, and rows of connections that are gone are cleaned up by the workers.
CREATE TABLE webhooks.wakeups (
    pid       integer PRIMARY KEY,
    armed_at  timestamptz NOT NULL DEFAULT now()
);

-- Events that at least one subscription wanted, with the delivery body built once.
-- Ids come from webhooks.event_ids at fan-out, in capture order. events, deliveries and
-- attempts are partitioned by day (sql/partitions.sql): created_at is the time of the
-- fan-out that wrote the event and its deliveries, so a day's events and deliveries are
-- dropped together once past retention.
CREATE SEQUENCE webhooks.event_ids;
CREATE TABLE webhooks.events (
    id              bigint NOT NULL,
    hook_resource   text NOT NULL,
    name            text NOT NULL,
    tenant          text,
    occurred_at     timestamptz NOT NULL,
    body            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);

-- The delivery queue: one row per event and subscription.
-- status: pending (due at next_attempt_at; while claimed, next_attempt_at is the lease
-- expiry, so a crashed worker's claim comes due again by itself), succeeded, failed.
-- No foreign keys (they would make partition maintenance lock webhooks.subscriptions):
-- deleting a subscription deletes its deliveries by trigger (sql/partitions.sql).
CREATE TABLE webhooks.deliveries (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    event_id         bigint NOT NULL,
    subscription_id  bigint NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CONSTRAINT deliveries_status_check
                     CHECK (status IN ('pending', 'succeeded', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX deliveries_due_idx ON webhooks.deliveries (next_attempt_at, id)
    WHERE status = 'pending';
-- Retention asks each old partition for its latest finish through this index.
CREATE INDEX deliveries_finished_idx ON webhooks.deliveries (finished_at)
    WHERE status <> 'pending';

-- One row per HTTP attempt, for inspection and for `webhooks status`; partitioned by day
-- of attempted_at and kept for the retention from when the attempt was made.
CREATE TABLE webhooks.attempts (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    delivery_id      bigint NOT NULL,
    subscription_id  bigint NOT NULL,
    attempt          integer NOT NULL,
    attempted_at     timestamptz NOT NULL,
    status           integer NOT NULL,  -- HTTP status, 0 when no response came
    duration_ms      double precision NOT NULL,
    error            text,
    PRIMARY KEY (id, attempted_at)
) PARTITION BY RANGE (attempted_at);
CREATE INDEX attempts_delivery_idx ON webhooks.attempts (delivery_id, id);
CREATE INDEX attempts_time_idx ON webhooks.attempts (attempted_at);

-- A subscription as the REST API returns it (SPEC section 4): the API sends this text as
-- is, so the JSON is built once, here. RFC 3339 UTC timestamps with microseconds.
-- Health of each worker's background tasks (the LISTEN connection, the recorder of
-- attempts, the pruner, and the claim loop itself). A worker writes a row when one of its
-- tasks crashes and is restarted; `webhooks status` shows the recent ones. Rows older than
-- WEBHOOKS_RETENTION are pruned by the workers.
CREATE TABLE webhooks.worker_tasks (
    worker         text NOT NULL,  -- host:pid:n of the worker process
    task           text NOT NULL,  -- listener, recorder, pruner or loop
    restarts       integer NOT NULL DEFAULT 0,  -- crashes of this task in this process
    last_error     text,           -- the last crash: exception type and message
    last_crash_at  timestamptz,
    PRIMARY KEY (worker, task)
);
CREATE INDEX worker_tasks_crash_idx ON webhooks.worker_tasks (last_crash_at);

-- Every name is schema-qualified: the API calls this for each row it lists, and a SET
-- search_path would cost a plan revalidation per call.
CREATE FUNCTION webhooks.subscription_json(s webhooks.subscriptions) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.json_build_object(
        'id', s.id,
        'resource', s.resource,
        'events', pg_catalog.array_to_string(s.events, ','),
        'target', s.target,
        'active', s.active,
        'last_status', s.last_status,
        'last_success_at', pg_catalog.to_char(s.last_success_at AT TIME ZONE 'UTC',
                                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'last_failure_at', pg_catalog.to_char(s.last_failure_at AT TIME ZONE 'UTC',
                                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'last_failure_content', s.last_failure_content,
        'filter', s.filter,
        'ordering', s.ordering)::pg_catalog.text
$$;

-- The delivery log (SPEC section 7): a subscription's deliveries, newest first, a page at
-- a time (`before=<id>`), within `since`/`until`: one backward range scan of this index
-- that stops after a page, however many deliveries the subscription has.
CREATE INDEX deliveries_log_idx ON webhooks.deliveries (subscription_id, created_at, id);

-- Strict ordering (SPEC section 10): a strict subscription's first pending delivery, the
-- only one the claim may take.
CREATE INDEX deliveries_pending_idx ON webhooks.deliveries (subscription_id, id)
    WHERE status = 'pending';
