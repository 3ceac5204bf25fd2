-- Change capture: webhooks.attach / webhooks.detach and the trigger function they install.
--
-- Three statement-level AFTER triggers per attached table, each with a transition table,
-- so a 100-row INSERT runs the function once, not 100 times. Everything the function needs
-- is passed as trigger arguments by attach(), so the hot path does no catalogue lookup and
-- no dynamic SQL; the only query it runs before writing is an index probe that skips the
-- write when no active subscription wants the event.

-- SECURITY DEFINER: application roles need no privileges on the webhooks schema to write
-- to an attached table. user_id falls back to session_user, the role that logged in.
CREATE OR REPLACE FUNCTION webhooks.capture() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- TG_ARGV, as written by webhooks.attach:
    -- 0 hook_resource, 1 noun, 2 resource, 3 id_column, 4 parent_resource,
    -- 5 parent_column, 6 user_column, 7 tenant_column, 8 exclude_columns, 9 include_row
    v_hook_resource text := TG_ARGV[0];
    v_name text := TG_ARGV[1] || CASE TG_OP WHEN 'INSERT' THEN '.create'
                                            WHEN 'UPDATE' THEN '.update'
                                            ELSE '.delete' END;
    v_user_setting text;
    v_rows jsonb[];
BEGIN
    PERFORM 1 FROM webhooks.subscriptions s
     WHERE s.active AND s.resource = v_hook_resource AND v_name = ANY (s.events)
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(to_jsonb(r)) INTO v_rows FROM new_rows r;
    ELSIF TG_OP = 'UPDATE' THEN
        -- Only rows that really changed: an UPDATE that rewrites a row with the same
        -- values produces no event.
        SELECT array_agg(j) INTO v_rows FROM (
            SELECT to_jsonb(r) AS j FROM new_rows r
            EXCEPT ALL
            SELECT to_jsonb(r) FROM old_rows r
        ) changed;
    ELSE
        SELECT array_agg(to_jsonb(r)) INTO v_rows FROM old_rows r;
    END IF;

    IF v_rows IS NULL THEN
        RETURN NULL;
    END IF;

    v_user_setting := nullif(current_setting('webhooks.user_id', true), '');

    INSERT INTO webhooks.outbox (hook_resource, name, resource, resource_id, parent_resource,
                                 parent_id, user_id, tenant_scoped, tenant, occurred_at, row_data)
    SELECT v_hook_resource,
           v_name,
           TG_ARGV[2],
           coalesce(c.j -> TG_ARGV[3], 'null'::jsonb),
           nullif(TG_ARGV[4], ''),
           CASE WHEN TG_ARGV[5] <> '' THEN coalesce(c.j -> TG_ARGV[5], 'null'::jsonb) END,
           coalesce(v_user_setting,
                    CASE WHEN TG_ARGV[6] <> '' THEN c.j ->> TG_ARGV[6] END,
                    session_user::text),
           TG_ARGV[7] <> '',
           CASE WHEN TG_ARGV[7] <> '' THEN c.j ->> TG_ARGV[7] END,
           statement_timestamp(),
           CASE WHEN TG_ARGV[9]::boolean THEN c.j - TG_ARGV[8]::text[] END
      FROM unnest(v_rows) WITH ORDINALITY AS c (j, n)
     ORDER BY c.n;

    -- Postgres folds identical notifications of one transaction into one, delivered
    -- at commit; the payload carries no row data.
    PERFORM pg_notify('webhooks', '');
    RETURN NULL;
END
$$;


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
                   'REFERENCING NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.capture(%s)',
                   attach.table_name, v_args);
    EXECUTE format('CREATE TRIGGER webhooks_2_update AFTER UPDATE ON %s '
                   'REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.capture(%s)',
                   attach.table_name, v_args);
    EXECUTE format('CREATE TRIGGER webhooks_3_delete AFTER DELETE ON %s '
                   'REFERENCING OLD TABLE AS old_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION webhooks.capture(%s)',
                   attach.table_name, v_args);
END
$$;

COMMENT ON FUNCTION webhooks.attach(regclass, text, text, text, text, text, text, text, text[],
                                    boolean, boolean) IS
    'Captures INSERT, UPDATE and DELETE of the table as <noun>.create/.update/.delete events '
    'and registers them under parent_resource, else resource. Idempotent.';
