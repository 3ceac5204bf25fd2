-- What the REST API reads through PostgreSQL: a subscription as the JSON it sends.

-- Every name is schema-qualified: the API calls this for each row it lists, and a SET
-- search_path would cost a plan revalidation per call.
-- Compact JSON (no spaces), in this order, like every other answer of the API; written
-- member by member because json_build_object puts " : " between names and values and
-- jsonb would reorder the members.
CREATE OR REPLACE FUNCTION webhooks.subscription_json(s webhooks.subscriptions) RETURNS text
LANGUAGE sql STABLE AS $$
    -- Joined with || (each part cast to text once) rather than concat(), which looks up
    -- each argument's output function at every call: a quarter of the row's cost. Every
    -- part that may be NULL is coalesced, as || would make the whole document NULL.
    -- Strings pass to_json for their escaping; a timestamp's to_char text needs none.
    SELECT '{"id":' OPERATOR(pg_catalog.||) s.id::pg_catalog.text
        OPERATOR(pg_catalog.||) ',"resource":'
        OPERATOR(pg_catalog.||) pg_catalog.to_json(s.resource)::pg_catalog.text
        OPERATOR(pg_catalog.||) ',"events":'
        OPERATOR(pg_catalog.||) pg_catalog.to_json(pg_catalog.array_to_string(s.events, ','))::pg_catalog.text
        OPERATOR(pg_catalog.||) ',"target":'
        OPERATOR(pg_catalog.||) pg_catalog.to_json(s.target)::pg_catalog.text
        OPERATOR(pg_catalog.||) ',"active":'
        OPERATOR(pg_catalog.||) CASE WHEN s.active THEN 'true' ELSE 'false' END
        -- Set when the service stopped it (detach, events made private, auto-disable);
        -- cleared when it is made active again.
        OPERATOR(pg_catalog.||) ',"inactive_reason":'
        OPERATOR(pg_catalog.||) coalesce(pg_catalog.to_json(s.inactive_reason)::pg_catalog.text, 'null')
        OPERATOR(pg_catalog.||) ',"last_status":'
        OPERATOR(pg_catalog.||) coalesce(s.last_status::pg_catalog.text, 'null')
        OPERATOR(pg_catalog.||) ',"last_success_at":'
        OPERATOR(pg_catalog.||) coalesce('"' OPERATOR(pg_catalog.||) pg_catalog.to_char(
            s.last_success_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
            OPERATOR(pg_catalog.||) '"', 'null')
        OPERATOR(pg_catalog.||) ',"last_failure_at":'
        OPERATOR(pg_catalog.||) coalesce('"' OPERATOR(pg_catalog.||) pg_catalog.to_char(
            s.last_failure_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
            OPERATOR(pg_catalog.||) '"', 'null')
        OPERATOR(pg_catalog.||) ',"last_failure_content":'
        OPERATOR(pg_catalog.||) coalesce(pg_catalog.to_json(s.last_failure_content)::pg_catalog.text, 'null')
        OPERATOR(pg_catalog.||) ',"filter":'
        OPERATOR(pg_catalog.||) coalesce(s.filter::pg_catalog.text, 'null')
        OPERATOR(pg_catalog.||) ',"ordering":'
        OPERATOR(pg_catalog.||) pg_catalog.to_json(s.ordering)::pg_catalog.text
        -- Only when it has one: a subscription without a limit reads as before.
        OPERATOR(pg_catalog.||) coalesce(',"rate_limit":'
                                         OPERATOR(pg_catalog.||) s.rate_limit::pg_catalog.text,
                                         '')
        OPERATOR(pg_catalog.||) '}'
$$;

REVOKE ALL ON FUNCTION webhooks.subscription_json(webhooks.subscriptions) FROM PUBLIC;

-- Each subscription keeps its document in `doc`, written here whenever the row is
-- inserted or updated (by the API, the worker's record of an attempt, the lifecycle, or
-- plain SQL), so the list reads the documents it pages through instead of building them
-- (building them was two thirds of a page's database time). The trigger's name puts it
-- after every other BEFORE trigger of the table (they run in name order), so it sees the
-- row as it will be stored.
CREATE OR REPLACE FUNCTION webhooks.subscription_doc() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.doc := webhooks.subscription_json(NEW);
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION webhooks.subscription_doc() FROM PUBLIC;

DROP TRIGGER IF EXISTS subscriptions_9_doc ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_9_doc BEFORE INSERT OR UPDATE ON webhooks.subscriptions
    FOR EACH ROW EXECUTE FUNCTION webhooks.subscription_doc();

-- The documents written before this file last ran (none, or made by an earlier
-- webhooks.subscription_json) are written again; the trigger fills them in. Only rows
-- whose document differs are touched: on an unchanged install this reads, and writes
-- nothing.
UPDATE webhooks.subscriptions s SET doc = NULL
 WHERE s.doc IS DISTINCT FROM webhooks.subscription_json(s);
