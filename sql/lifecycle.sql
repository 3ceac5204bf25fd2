-- The failure lifecycle of subscriptions: operational events and
-- auto-disable. Re-applied by every `webhooks migrate`, after sql/fanout.sql and
-- sql/recovery.sql; the hook events webhook.disabled, .failing and .recovered are rows that
-- migration 0004 registered.
--
-- The worker's `record` query keeps webhooks.subscriptions.failing_since (the first failed
-- attempt after the last success) and recovered_at (the first success after webhook.failing
-- was queued); every few seconds a worker runs webhooks.lifecycle(), which turns them into
-- events and auto-disables.

-- Queues the operational event `event_name` about `subject`: one event, and one delivery
-- to each active subscription to it of the subject's owner (of the subject's tenant, when
-- the receiving subscription has one), never to the subject itself. Nothing when no one
-- wants it. Returns the number of deliveries queued.
CREATE OR REPLACE FUNCTION webhooks.lifecycle_event(subject webhooks.subscriptions,
                                                    event_name text)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_event bigint;
    v_count integer;
    v_recipients bigint[];
BEGIN
    SELECT array_agg(t.id ORDER BY t.id) INTO v_recipients
      FROM webhooks.subscription_events se
      JOIN webhooks.subscriptions t ON t.id = se.subscription_id
     WHERE se.resource = 'webhooks' AND se.event = lifecycle_event.event_name
       AND (se.tenant IS NULL OR se.tenant = lifecycle_event.subject.tenant)
       AND t.owner = lifecycle_event.subject.owner
       AND t.id <> lifecycle_event.subject.id
       AND t.active;
    IF v_recipients IS NULL THEN
        RETURN 0;
    END IF;
    v_event := nextval('webhooks.event_ids'::regclass);
    INSERT INTO webhooks.events (id, hook_resource, name, tenant, occurred_at, body)
    VALUES (v_event, 'webhooks', lifecycle_event.event_name, lifecycle_event.subject.tenant,
            now(),
            '{"event": '
            || webhooks.event_json(v_event, lifecycle_event.event_name, 'webhooks',
                                   to_jsonb(lifecycle_event.subject.id), NULL, now())
            -- The subscription as the API shows it, members in the same order: its doc,
            -- which `subject` holds as stored (every caller passes the row its UPDATE
            -- returned, after the trigger wrote it).
            || webhooks.body_member('resource', webhooks.ordered_json(
                   lifecycle_event.subject.doc::json), NULL)
            || '}');
    INSERT INTO webhooks.deliveries (event_id, subscription_id)
    SELECT v_event, r FROM unnest(v_recipients) AS r;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- One round of the lifecycle, run by the workers every few seconds (one at a time; a
-- worker that does not get the lock skips). In this order, each once per episode:
--   webhook.recovered  the first success after webhook.failing (recorded as recovered_at);
--   webhook.failing    the first failure after the last success is `failing_after` old;
--   webhook.disabled   it is `disable_after` old (unless that is 0): the subscription
--                      becomes inactive, last_failure_content says why and since when, and
--                      its pending deliveries fail (webhooks.recover brings them back).
-- Rows being written by the recorder at that moment are skipped, for the next round.
-- Previous secrets past their overlap are forgotten on the way. Returns one row per
-- event, for the worker's log and metrics.
CREATE OR REPLACE FUNCTION webhooks.lifecycle(failing_after interval, disable_after interval)
RETURNS TABLE (subscription_id bigint, owner text, event text, since timestamptz,
               queued integer)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_old webhooks.subscriptions;
    v_new webhooks.subscriptions;
    v_queued integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('webhooks.lifecycle')) THEN
        RETURN;
    END IF;

    FOR v_old IN
        SELECT * FROM webhooks.subscriptions s
         WHERE s.recovered_at IS NOT NULL
         ORDER BY s.id
           FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE webhooks.subscriptions s SET recovered_at = NULL
         WHERE s.id = v_old.id RETURNING * INTO v_new;
        subscription_id := v_old.id; owner := v_old.owner; event := 'webhook.recovered';
        since := v_old.recovered_at;
        queued := webhooks.lifecycle_event(v_new, 'webhook.recovered');
        v_queued := v_queued + queued;
        RETURN NEXT;
    END LOOP;

    FOR v_old IN
        SELECT * FROM webhooks.subscriptions s
         WHERE s.active AND s.failing_since IS NOT NULL AND s.failing_notified_at IS NULL
           AND s.failing_since <= now() - lifecycle.failing_after
         ORDER BY s.id
           FOR UPDATE SKIP LOCKED
    LOOP
        UPDATE webhooks.subscriptions s SET failing_notified_at = now()
         WHERE s.id = v_old.id RETURNING * INTO v_new;
        subscription_id := v_old.id; owner := v_old.owner; event := 'webhook.failing';
        since := v_old.failing_since;
        queued := webhooks.lifecycle_event(v_new, 'webhook.failing');
        v_queued := v_queued + queued;
        RETURN NEXT;
    END LOOP;

    IF lifecycle.disable_after > interval '0' THEN
        FOR v_old IN
            SELECT * FROM webhooks.subscriptions s
             WHERE s.active AND s.failing_since IS NOT NULL
               AND s.failing_since <= now() - lifecycle.disable_after
             ORDER BY s.id
               FOR UPDATE SKIP LOCKED
        LOOP
            UPDATE webhooks.subscriptions s
               SET active = false, disabled_at = now(),
                   inactive_reason = format(
                       'disabled automatically: every delivery attempt has failed since %s '
                       '(WEBHOOKS_DISABLE_AFTER); re-activate it with PUT {"active": true}, '
                       'then recover what failed',
                       to_char(v_old.failing_since AT TIME ZONE 'UTC',
                               'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
                   last_failure_content = format(
                       'disabled automatically: every delivery attempt has failed since %s '
                       '(WEBHOOKS_DISABLE_AFTER); re-activate it with PUT {"active": true}, '
                       'then recover what failed',
                       to_char(v_old.failing_since AT TIME ZONE 'UTC',
                               'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
             WHERE s.id = v_old.id RETURNING * INTO v_new;
            -- Deliveries being recorded right now are skipped (waiting for them could
            -- deadlock with the recorder); the claim closes them as failed later.
            UPDATE webhooks.deliveries d
               SET status = 'failed', finished_at = now(), lease_expires_at = NULL
             WHERE d.id IN (SELECT p.id FROM webhooks.deliveries p
                             WHERE p.subscription_id = v_old.id AND p.status = 'pending'
                               FOR UPDATE SKIP LOCKED);
            subscription_id := v_old.id; owner := v_old.owner; event := 'webhook.disabled';
            since := v_old.failing_since;
            queued := webhooks.lifecycle_event(v_new, 'webhook.disabled');
            v_queued := v_queued + queued;
            RETURN NEXT;
        END LOOP;
    END IF;

    UPDATE webhooks.subscriptions s
       SET previous_secret = NULL, previous_secret_expires_at = NULL
     WHERE s.id IN (SELECT p.id FROM webhooks.subscriptions p
                     WHERE p.previous_secret_expires_at <= now()
                       FOR UPDATE SKIP LOCKED);

    -- The backstop of strict ordering's parking (sql/ordering.sql): a head left parked
    -- (its recorder died between the record and the unpark) comes due, and so does
    -- whatever an inactive or unordered subscription has parked. A few index probes per
    -- subscription that has parked deliveries.
    v_queued := v_queued + webhooks.unpark(webhooks.parked_subscriptions())::integer;

    IF v_queued > 0 THEN
        -- Idle workers wake for the new deliveries (as the capture trigger would).
        PERFORM pg_notify('webhooks', '') FROM webhooks.wakeups LIMIT 1;
    END IF;
END
$$;

-- A subscription made active again starts a new lifecycle: its old failure episode (the
-- one that disabled it, say) no longer counts.
CREATE OR REPLACE FUNCTION webhooks.subscription_reactivated() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.failing_since := NULL;
    NEW.failing_notified_at := NULL;
    NEW.recovered_at := NULL;
    NEW.disabled_at := NULL;
    NEW.inactive_reason := NULL;
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS subscriptions_0_reactivated ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_0_reactivated BEFORE UPDATE ON webhooks.subscriptions
    FOR EACH ROW WHEN (NEW.active AND NOT OLD.active)
    EXECUTE FUNCTION webhooks.subscription_reactivated();

REVOKE ALL ON FUNCTION webhooks.lifecycle_event(webhooks.subscriptions, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.lifecycle(interval, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.subscription_reactivated() FROM PUBLIC;
