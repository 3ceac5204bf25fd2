-- What the REST API reads through PostgreSQL: a subscription as the JSON it sends.

-- Every name is schema-qualified: the API calls this for each row it lists, and a SET
-- search_path would cost a plan revalidation per call.
CREATE OR REPLACE FUNCTION webhooks.subscription_json(s webhooks.subscriptions) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.json_build_object(
        'id', s.id,
        'resource', s.resource,
        'events', pg_catalog.array_to_string(s.events, ','),
        'target', s.target,
        'active', s.active,
        -- Set when the service stopped it (detach, events made private, auto-disable);
        -- cleared when it is made active again.
        'inactive_reason', s.inactive_reason,
        'last_status', s.last_status,
        'last_success_at', pg_catalog.to_char(s.last_success_at AT TIME ZONE 'UTC',
                                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'last_failure_at', pg_catalog.to_char(s.last_failure_at AT TIME ZONE 'UTC',
                                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'last_failure_content', s.last_failure_content,
        'filter', s.filter,
        'ordering', s.ordering)::pg_catalog.text
$$;

REVOKE ALL ON FUNCTION webhooks.subscription_json(webhooks.subscriptions) FROM PUBLIC;
