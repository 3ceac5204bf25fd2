-- Time partitions of the queue tables (events, deliveries, attempts): one partition per
-- UTC day, created ahead of time and dropped whole once past retention, so retention is
-- never a long DELETE and finished rows never leave dead tuples for vacuum to chase.
-- Re-applied by every `webhooks migrate`; the workers call these functions
-- (service/worker/pruning.py), and a DBA may too.
--
-- events and deliveries are partitioned on created_at, the time of the fan-out that made
-- them (an event and its deliveries are written by one statement, so they share it); a
-- day's events go with that day's deliveries. attempts are partitioned on attempted_at
-- and kept for the retention from when they were made.
--
-- No foreign key crosses these tables or points from them to subscriptions: a foreign key
-- would make creating and detaching partitions lock webhooks.subscriptions. Instead, the
-- deletion of a subscription deletes its deliveries (webhooks.forget_deliveries below) and
-- the workers close pending deliveries left without a subscription
-- (webhooks.close_orphans); attempts of a deleted subscription wait for their partition.

-- Every partition of the three tables with its bounds ('-infinity'/'infinity' for
-- MINVALUE/MAXVALUE) and whether a DETACH ... CONCURRENTLY of it was interrupted. The
-- bounds are read back from their text form, so that is written and parsed in UTC and
-- ISO style whatever the caller's session says (a time zone abbreviation such as IST
-- would not read back as written). A SQL function's body is parsed again in the caller's
-- session: the pattern holds no backslash, which standard_conforming_strings = off would
-- take as an escape.
CREATE OR REPLACE FUNCTION webhooks.partition_bounds()
RETURNS TABLE (parent text, partition text, lower_bound timestamptz,
               upper_bound timestamptz, detach_pending boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET "TimeZone" = 'UTC'
SET "DateStyle" = 'ISO, YMD'
AS $$
SELECT parent.relname::text,
       child.relname::text,
       CASE WHEN b[1] = 'MINVALUE' THEN '-infinity'::timestamptz
            ELSE btrim(b[1], '''')::timestamptz END,
       CASE WHEN b[2] = 'MAXVALUE' THEN 'infinity'::timestamptz
            ELSE btrim(b[2], '''')::timestamptz END,
       i.inhdetachpending
  FROM pg_inherits i
  JOIN pg_class parent ON parent.oid = i.inhparent
  JOIN pg_namespace n ON n.oid = parent.relnamespace
  JOIN pg_class child ON child.oid = i.inhrelid
 CROSS JOIN LATERAL regexp_match(pg_get_expr(child.relpartbound, child.oid),
                                 '^FOR VALUES FROM [(](.+)[)] TO [(](.+)[)]$') AS b
 WHERE n.nspname = 'webhooks'
   AND parent.relname IN ('events', 'deliveries', 'attempts')
$$;

CREATE OR REPLACE VIEW webhooks.queue_partitions AS
SELECT parent, partition, lower_bound, upper_bound, detach_pending
  FROM webhooks.partition_bounds();

-- Creates the daily partitions of the three tables that cover [since, until] and do not
-- exist yet; returns how many it created. A partition is created on its own and then
-- attached, which locks the parent in SHARE UPDATE EXCLUSIVE mode only: writers, claims
-- and readers go on. One caller at a time (an advisory lock); if a lock is not granted
-- within lock_timeout, the call fails and the next round tries again (partitions are made
-- days ahead).
CREATE OR REPLACE FUNCTION webhooks.ensure_partitions(since timestamptz, until timestamptz)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET "TimeZone" = 'UTC'
SET "DateStyle" = 'ISO, YMD'
SET lock_timeout = '2s'
AS $$
DECLARE
    v_day date;
    v_table text;
    v_lower timestamptz;
    v_upper timestamptz;
    v_start timestamptz;
    v_name text;
    v_created integer := 0;
BEGIN
    IF since IS NULL OR until IS NULL OR until < since THEN
        RAISE EXCEPTION 'ensure_partitions needs since <= until'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF until - since > interval '3660 days' THEN
        RAISE EXCEPTION 'ensure_partitions covers at most 3660 days at a time'
              USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_advisory_xact_lock(7315600212945527043);
    FOR v_day IN SELECT d::date
                   FROM generate_series(since::date, until::date, interval '1 day') AS d
    LOOP
        v_lower := v_day::timestamp AT TIME ZONE 'UTC';
        v_upper := (v_day + 1)::timestamp AT TIME ZONE 'UTC';
        FOREACH v_table IN ARRAY ARRAY['events', 'deliveries', 'attempts'] LOOP
            -- The day is covered when a partition reaches its end; otherwise the new one
            -- starts where the partitions overlapping the day stop (the partition that
            -- migration 0005 made of the rows before it ends within a day).
            CONTINUE WHEN EXISTS (SELECT 1 FROM webhooks.queue_partitions p
                                   WHERE p.parent = v_table
                                     AND p.lower_bound <= v_lower
                                     AND p.upper_bound >= v_upper);
            SELECT greatest(v_lower, max(p.upper_bound)) INTO v_start
              FROM webhooks.queue_partitions p
             WHERE p.parent = v_table
               AND p.upper_bound > v_lower AND p.lower_bound < v_upper;
            v_start := coalesce(v_start, v_lower);
            CONTINUE WHEN v_start >= v_upper;
            v_name := v_table || '_p' || to_char(v_day, 'YYYYMMDD');
            EXECUTE format('CREATE TABLE webhooks.%I (LIKE webhooks.%I INCLUDING DEFAULTS '
                           'INCLUDING CONSTRAINTS INCLUDING STORAGE)', v_name, v_table);
            EXECUTE format('ALTER TABLE webhooks.%I ATTACH PARTITION webhooks.%I '
                           'FOR VALUES FROM (%L) TO (%L)', v_table, v_name, v_start, v_upper);
            v_created := v_created + 1;
        END LOOP;
    END LOOP;
    RETURN v_created;
END
$$;

-- Whether a deliveries partition (attached or just detached) still holds work: a pending
-- delivery, or one finished after `cutoff`. Both are answered by the partition's partial
-- indexes, without reading its rows. The cutoff goes in as a parameter, never as text: a
-- DBA's session in Asia/Kolkata would write it as IST, which reads back as Israel's.
CREATE OR REPLACE FUNCTION webhooks.deliveries_partition_busy(partition text, cutoff timestamptz)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_busy boolean;
BEGIN
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM webhooks.%I WHERE status = ''pending'')'
                   ' OR EXISTS (SELECT 1 FROM webhooks.%I WHERE status <> ''pending'''
                   ' AND finished_at > $1)', partition, partition)
       INTO v_busy USING cutoff;
    RETURN v_busy;
END
$$;

-- The queue's floor (webhooks.queue_floor, migration 0016): no delivery created before it
-- is pending. The worker passes the floor it last read to the claim and the fan-out, whose
-- bounds on created_at then leave the older partitions out of the plan when it starts (a
-- scan of each day's partition set up at every execution, with the default retention ten
-- of them); each of those statements checks first that the floor has not been lowered
-- since (claiming nothing when it has, so that the worker reads it again).
-- refresh_queue_floor() raises the floor to the start of the oldest partition that holds a
-- pending delivery, never past the start of yesterday (UTC), so that a transaction still
-- inserting deliveries dated before midnight is not left below it; returns the floor. The
-- workers call it every few seconds. It locks the floor's row first and then looks
-- (each statement with its own snapshot), so a redeliver or recover that lowers the floor
-- is either seen or waits for it.
CREATE OR REPLACE FUNCTION webhooks.refresh_queue_floor()
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_since timestamptz := date_trunc('day', now() - interval '1 day', 'UTC');
    p record;
BEGIN
    PERFORM 1 FROM webhooks.queue_floor f FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO webhooks.queue_floor (since) VALUES ('-infinity') ON CONFLICT DO NOTHING;
        PERFORM 1 FROM webhooks.queue_floor f FOR UPDATE;
    END IF;
    FOR p IN SELECT q.partition, q.lower_bound FROM webhooks.queue_partitions q
              WHERE q.parent = 'deliveries' AND q.lower_bound < v_since
              ORDER BY q.lower_bound
    LOOP
        -- Busy with no delivery finished after 'infinity': holding a pending one.
        IF webhooks.deliveries_partition_busy(p.partition, 'infinity') THEN
            v_since := p.lower_bound;
            EXIT;
        END IF;
    END LOOP;
    UPDATE webhooks.queue_floor f SET since = v_since WHERE f.since IS DISTINCT FROM v_since;
    RETURN v_since;
END
$$;

-- Lowers the queue's floor to `since` if it is above it: called, in the same transaction,
-- by whatever makes a delivery created at `since` pending again (redeliver, recover). It
-- always takes the floor's row lock, so that a refresh running meanwhile sees the
-- delivery or waits for this transaction.
CREATE OR REPLACE FUNCTION webhooks.lower_queue_floor(since timestamptz)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
UPDATE webhooks.queue_floor f SET since = least(f.since, lower_queue_floor.since)
$$;

-- The partitions that retention may drop now, in the order to drop them: partitions of
-- deliveries whose whole range is older than `retention`, that hold no pending delivery
-- and no delivery finished within `retention`, each followed by the events partition of
-- the same range; then attempts partitions whose whole range is older than `retention`.
-- Partitions whose detach was interrupted come first. The caller detaches each
-- (CONCURRENTLY), checks the detached table again and drops it (see
-- service/worker/pruning.py), so a delivery requeued meanwhile is never lost.
CREATE OR REPLACE FUNCTION webhooks.expired_partitions(retention interval)
RETURNS TABLE (parent text, partition text, lower_bound timestamptz,
               upper_bound timestamptz, detach_pending boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET "TimeZone" = 'UTC'
SET "DateStyle" = 'ISO, YMD'
AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz := now() - retention;
    p record;
BEGIN
    RETURN QUERY
        SELECT q.parent, q.partition, q.lower_bound, q.upper_bound, true
          FROM webhooks.queue_partitions q
         WHERE q.detach_pending
         ORDER BY q.parent = 'events', q.upper_bound;
    FOR p IN SELECT q.partition, q.lower_bound, q.upper_bound FROM webhooks.queue_partitions q
              WHERE q.parent = 'deliveries' AND NOT q.detach_pending
                AND q.upper_bound <= v_cutoff
              ORDER BY q.upper_bound
    LOOP
        -- Deliveries are dropped oldest first: a busy partition holds the later ones.
        EXIT WHEN webhooks.deliveries_partition_busy(p.partition, v_cutoff);
        RETURN QUERY SELECT 'deliveries'::text, p.partition, p.lower_bound, p.upper_bound,
                            false;
        RETURN QUERY
            SELECT q.parent, q.partition, q.lower_bound, q.upper_bound, false
              FROM webhooks.queue_partitions q
             WHERE q.parent = 'events' AND NOT q.detach_pending
               AND q.lower_bound = p.lower_bound AND q.upper_bound = p.upper_bound;
    END LOOP;
    RETURN QUERY
        SELECT q.parent, q.partition, q.lower_bound, q.upper_bound, false
          FROM webhooks.queue_partitions q
         WHERE q.parent = 'attempts' AND NOT q.detach_pending
           AND q.upper_bound <= v_cutoff
         ORDER BY q.upper_bound;
END
$$;

-- Called with a deliveries partition that retention has just detached: when it holds a
-- pending delivery or one finished within `retention` (requeued between
-- expired_partitions and the detach), attaches it again with its bounds and returns true
-- (kept); otherwise returns false and the caller drops it.
CREATE OR REPLACE FUNCTION webhooks.keep_detached_deliveries(detached text, lower_bound timestamptz,
                                                  upper_bound timestamptz,
                                                  retention interval)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET "TimeZone" = 'UTC'
SET "DateStyle" = 'ISO, YMD'
AS $$
DECLARE
    v_busy boolean;
BEGIN
    v_busy := webhooks.deliveries_partition_busy(detached, now() - retention);
    IF v_busy THEN
        EXECUTE format('ALTER TABLE webhooks.deliveries ATTACH PARTITION webhooks.%I '
                       'FOR VALUES FROM (%s) TO (%s)', detached,
                       CASE WHEN lower_bound = '-infinity' THEN 'MINVALUE'
                            ELSE quote_literal(lower_bound) END,
                       CASE WHEN upper_bound = 'infinity' THEN 'MAXVALUE'
                            ELSE quote_literal(upper_bound) END);
    END IF;
    RETURN v_busy;
END
$$;

-- Deleting subscriptions deletes their deliveries (what ON DELETE CASCADE did before the
-- tables were partitioned), one index range per subscription and partition.
CREATE OR REPLACE FUNCTION webhooks.forget_deliveries() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM webhooks.deliveries d
     USING gone g
     WHERE d.subscription_id = g.id;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS subscriptions_forget_deliveries ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_forget_deliveries
    AFTER DELETE ON webhooks.subscriptions
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks.forget_deliveries();

-- Pending deliveries whose subscription is gone (a fan-out that read the subscription
-- while it was being deleted) are deleted; returns how many. Run by the workers before
-- retention, so such a delivery never holds its partition.
CREATE OR REPLACE FUNCTION webhooks.close_orphans() RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count bigint;
BEGIN
    DELETE FROM webhooks.deliveries d
     WHERE d.status = 'pending'
       AND NOT EXISTS (SELECT 1 FROM webhooks.subscriptions s WHERE s.id = d.subscription_id);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

REVOKE ALL ON FUNCTION webhooks.partition_bounds() FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.ensure_partitions(timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.deliveries_partition_busy(text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.expired_partitions(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.refresh_queue_floor() FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.lower_queue_floor(timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.keep_detached_deliveries(text, timestamptz, timestamptz,
                                                         interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.forget_deliveries() FROM PUBLIC;
REVOKE ALL ON FUNCTION webhooks.close_orphans() FROM PUBLIC;

-- Today's partitions and the next two days'; the workers keep two days ahead.
DO $$ BEGIN PERFORM webhooks.ensure_partitions(now(), now() + interval '2 days'); END $$;
