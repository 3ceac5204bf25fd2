-- What the REST API reads through PostgreSQL: a subscription as the JSON it sends.

-- Every name is schema-qualified: the API calls this for each row it lists, and a SET
-- search_path would cost a plan revalidation per call.
-- Compact JSON (no spaces), in this order, like every other answer of the API; written
-- member by member because json_build_object puts " : " between names and values and
-- jsonb would reorder the members.
CREATE OR REPLACE FUNCTION webhooks.subscription_json(s webhooks.subscriptions) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.concat(
        '{"id":', s.id,
        ',"resource":', pg_catalog.to_json(s.resource),
        ',"events":', pg_catalog.to_json(pg_catalog.array_to_string(s.events, ',')),
        ',"target":', pg_catalog.to_json(s.target),
        ',"active":', pg_catalog.to_json(s.active),
        -- Set when the service stopped it (detach, events made private, auto-disable);
        -- cleared when it is made active again.
        ',"inactive_reason":', coalesce(pg_catalog.to_json(s.inactive_reason)::pg_catalog.text, 'null'),
        ',"last_status":', coalesce(s.last_status::pg_catalog.text, 'null'),
        ',"last_success_at":', coalesce(pg_catalog.to_json(pg_catalog.to_char(
            s.last_success_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))::pg_catalog.text, 'null'),
        ',"last_failure_at":', coalesce(pg_catalog.to_json(pg_catalog.to_char(
            s.last_failure_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))::pg_catalog.text, 'null'),
        ',"last_failure_content":', coalesce(pg_catalog.to_json(s.last_failure_content)::pg_catalog.text, 'null'),
        ',"filter":', coalesce(s.filter::pg_catalog.text, 'null'),
        ',"ordering":', pg_catalog.to_json(s.ordering),
        '}')
$$;

REVOKE ALL ON FUNCTION webhooks.subscription_json(webhooks.subscriptions) FROM PUBLIC;
