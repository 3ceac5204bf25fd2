-- Strict ordering's queue: a strict subscription sends only its first pending delivery
-- (its head, lowest id: event order), so the deliveries behind the head are kept out of
-- the due range, parked at next_attempt_at = 'infinity'. The claim reads the due index in
-- order; without parking, every claim of every worker read a held queue's rows and
-- dropped each one as not the head (20,000 held deliveries cost every claim 15 ms).
-- Re-applied by every `webhooks migrate`, after sql/fanout.sql.
--
-- Who parks and who unparks:
--   - the fan-out (sql/queries/fanout.sql) parks a strict subscription's new deliveries
--     behind its pending head, or behind the batch's first;
--   - backfills and webhooks.recover park through webhooks.park_held;
--   - the recorder, after a strict subscription's delivery finished, runs
--     webhooks.unpark for it: the next pending delivery comes due;
--   - a subscription made inactive, or no longer strict, has its parked deliveries
--     unparked by a trigger (the claim closes an inactive subscription's deliveries);
--   - every lifecycle round (sql/lifecycle.sql) runs webhooks.unpark over the
--     subscriptions that have parked deliveries, so a head left parked (a crash between
--     a record and its unpark, a worker of the version before) waits one round (at most
--     5 s), never for ever.
-- A parker locks the head it parks behind (FOR SHARE, SKIP LOCKED, status = 'pending'
-- re-checked on the newest version): the recorder's update of that head waits for the
-- parker's commit, and its unpark, a later statement, sees what was parked. A head that
-- is locked is skipped, and what comes after it is left due: ordering never depends on
-- parking (the claim checks the head per row), only the claim's cost does.
-- A delivery unparked comes due at its creation time, its place in the queue had it
-- never been parked.

-- The parked deliveries of each subscription in `subscription_ids` come due: for an
-- active strict subscription only its first pending delivery, for any other (unordered,
-- inactive) every parked one. Returns how many came due.
CREATE OR REPLACE FUNCTION webhooks.unpark(subscription_ids bigint[]) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_heads bigint;
    v_rest bigint;
BEGIN
    UPDATE webhooks.deliveries d
       SET next_attempt_at = d.created_at
      FROM (SELECT h.id, h.created_at
              FROM webhooks.subscriptions s
             CROSS JOIN LATERAL (
                SELECT p.id, p.created_at, p.next_attempt_at FROM webhooks.deliveries p
                 WHERE p.subscription_id = s.id AND p.status = 'pending'
                 ORDER BY p.id LIMIT 1) h
             WHERE s.id = ANY (unpark.subscription_ids)
               AND s.ordering = 'strict' AND s.active
               AND h.next_attempt_at = 'infinity') h
     WHERE d.id = h.id AND d.created_at = h.created_at
       AND d.status = 'pending' AND d.next_attempt_at = 'infinity';
    GET DIAGNOSTICS v_heads = ROW_COUNT;
    UPDATE webhooks.deliveries d
       SET next_attempt_at = d.created_at
     WHERE d.subscription_id IN (SELECT s.id FROM webhooks.subscriptions s
                                  WHERE s.id = ANY (unpark.subscription_ids)
                                    AND (s.ordering <> 'strict' OR NOT s.active))
       AND d.status = 'pending' AND d.next_attempt_at = 'infinity';
    GET DIAGNOSTICS v_rest = ROW_COUNT;
    RETURN v_heads + v_rest;
END
$$;

-- The subscriptions that have parked deliveries: a skip scan of deliveries_parked_idx
-- (migration 0014), one index probe per subscription found.
CREATE OR REPLACE FUNCTION webhooks.parked_subscriptions() RETURNS bigint[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH RECURSIVE found (id) AS (
        (SELECT d.subscription_id FROM webhooks.deliveries d
          WHERE d.status = 'pending' AND d.next_attempt_at = 'infinity'
          ORDER BY d.subscription_id LIMIT 1)
        UNION ALL
        SELECT (SELECT d.subscription_id FROM webhooks.deliveries d
                 WHERE d.status = 'pending' AND d.next_attempt_at = 'infinity'
                   AND d.subscription_id > f.id
                 ORDER BY d.subscription_id LIMIT 1)
          FROM found f WHERE f.id IS NOT NULL
    )
    SELECT coalesce(array_agg(f.id), '{}') FROM found f WHERE f.id IS NOT NULL
$$;

-- Parks the due deliveries of a strict subscription that wait behind its head, from the
-- delivery `from_id` on (the first one a backfill batch or a recovery queued), and makes
-- the head due if it was parked. Deliveries in flight (leased) or waiting for a retry are
-- left as they are. Nothing for an unordered or inactive subscription. Returns how many
-- were parked.
CREATE OR REPLACE FUNCTION webhooks.park_held(subscription_id bigint, from_id bigint)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_head bigint;
    v_count bigint;
BEGIN
    PERFORM 1 FROM webhooks.subscriptions s
     WHERE s.id = park_held.subscription_id AND s.ordering = 'strict' AND s.active;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    SELECT p.id INTO v_head FROM webhooks.deliveries p
     WHERE p.subscription_id = park_held.subscription_id AND p.status = 'pending'
     ORDER BY p.id LIMIT 1
       FOR SHARE OF p SKIP LOCKED;
    IF v_head IS NULL THEN
        RETURN 0;
    END IF;
    UPDATE webhooks.deliveries d
       SET next_attempt_at = 'infinity'
     WHERE d.subscription_id = park_held.subscription_id AND d.status = 'pending'
       AND d.id > v_head AND d.id >= park_held.from_id
       AND d.lease_expires_at IS NULL AND d.next_attempt_at <= now();
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM webhooks.unpark(ARRAY[park_held.subscription_id]);
    RETURN v_count;
END
$$;

-- A subscription made inactive or unordered has its parked deliveries unparked; one made
-- active (again) or strict has its queue parked behind its head.
CREATE OR REPLACE FUNCTION webhooks.subscription_ordering_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.active AND NEW.ordering = 'strict' THEN
        PERFORM webhooks.park_held(NEW.id, 0);
    ELSE
        PERFORM webhooks.unpark(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS subscriptions_5_ordering ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_5_ordering
    AFTER UPDATE OF active, ordering ON webhooks.subscriptions
    FOR EACH ROW
    WHEN (OLD.active IS DISTINCT FROM NEW.active OR OLD.ordering IS DISTINCT FROM NEW.ordering)
    EXECUTE FUNCTION webhooks.subscription_ordering_changed();

REVOKE ALL ON FUNCTION webhooks.unpark(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.park_held(bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.parked_subscriptions() FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.subscription_ordering_changed() FROM PUBLIC;
