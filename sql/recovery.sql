-- Redelivery and recovery: the one implementation that the REST API,
-- the `webhooks` CLI and a DBA at a psql prompt all call. Re-applied by every
-- `webhooks migrate`, after sql/fanout.sql and sql/ordering.sql.
--
-- Both keep delivery ids (receivers de-duplicate on them) and give the delivery a fresh
-- retry schedule: `attempts` goes back to 0, so a delivery brought back after an outage
-- is retried on the whole WEBHOOKS_RETRY_SCHEDULE again, not failed after one try (its
-- attempt log keeps every earlier attempt; numbering restarts at 1). Requeuing a
-- delivery whose attempt is in flight may send it twice (at-least-once; same id).
--
-- Errors, for callers to map: P0002 (no_data_found) for an unknown delivery or
-- subscription, 55000 (object_not_in_prerequisite_state) for an inactive subscription.

-- One delivery, whatever its status, becomes pending and due now, its lease cleared.
-- Returns the delivery's id.
CREATE OR REPLACE FUNCTION webhooks.redeliver(delivery_id bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_subscription bigint;
    v_created timestamptz;
    v_active boolean;
BEGIN
    SELECT d.subscription_id, d.created_at INTO v_subscription, v_created
      FROM webhooks.deliveries d
     WHERE d.id = redeliver.delivery_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no delivery with id %', redeliver.delivery_id
              USING ERRCODE = 'no_data_found';
    END IF;
    -- Locked, so that a deactivation cannot slip in between the check and the update.
    SELECT s.active INTO v_active
      FROM webhooks.subscriptions s
     WHERE s.id = v_subscription
       FOR SHARE;
    IF NOT v_active THEN
        RAISE EXCEPTION 'subscription % is inactive; activate it before redelivering',
                        v_subscription
              USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    UPDATE webhooks.deliveries d
       SET status = 'pending', attempts = 0, next_attempt_at = now(),
           lease_expires_at = NULL, finished_at = NULL
     WHERE d.id = redeliver.delivery_id;
    -- The claim looks no further back than the queue's floor (sql/partitions.sql).
    PERFORM webhooks.lower_queue_floor(v_created);
    -- A waiting worker is woken as by a captured change (the conditional NOTIFY).
    PERFORM pg_catalog.pg_notify('webhooks', '') FROM webhooks.wakeups LIMIT 1;
    RETURN redeliver.delivery_id;
END
$$;

-- Every failed delivery of the subscription created in [since, until) becomes pending and
-- due now (until NULL: no upper bound). They all get the same next_attempt_at, so the
-- worker's claim (ORDER BY next_attempt_at, id) sends them in id order, which is event
-- order (fan-out creates deliveries in event order). Returns how many were requeued.
CREATE OR REPLACE FUNCTION webhooks.recover(subscription_id bigint, since timestamptz,
                                            until timestamptz DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_active boolean;
    v_count bigint;
    v_oldest timestamptz;
BEGIN
    IF since IS NULL THEN
        RAISE EXCEPTION 'recover needs the start of the window (since)'
              USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT s.active INTO v_active
      FROM webhooks.subscriptions s
     WHERE s.id = recover.subscription_id
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no subscription with id %', recover.subscription_id
              USING ERRCODE = 'no_data_found';
    END IF;
    IF NOT v_active THEN
        RAISE EXCEPTION 'subscription % is inactive; activate it before recovering',
                        recover.subscription_id
              USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    WITH requeued AS (
        UPDATE webhooks.deliveries d
           SET status = 'pending', attempts = 0, next_attempt_at = now(),
               lease_expires_at = NULL, finished_at = NULL
         WHERE d.subscription_id = recover.subscription_id
           AND d.status = 'failed'
           AND d.created_at >= recover.since
           AND (recover.until IS NULL OR d.created_at < recover.until)
        RETURNING d.created_at
    )
    SELECT count(*), min(r.created_at) INTO v_count, v_oldest FROM requeued r;
    IF v_count > 0 THEN
        -- The claim looks no further back than the queue's floor (sql/partitions.sql).
        PERFORM webhooks.lower_queue_floor(v_oldest);
        -- A strict subscription's requeued deliveries wait behind its head, parked
        -- (sql/ordering.sql).
        PERFORM webhooks.park_held(recover.subscription_id, 0);
        PERFORM pg_catalog.pg_notify('webhooks', '') FROM webhooks.wakeups LIMIT 1;
    END IF;
    RETURN v_count;
END
$$;

REVOKE ALL ON FUNCTION webhooks.redeliver(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.recover(bigint, timestamptz, timestamptz) FROM PUBLIC;
