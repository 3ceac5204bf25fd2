-- Rate limits per subscription (migration 0019): each limited subscription's bucket in
-- webhooks.rate_buckets, kept here whoever writes the subscription (API, CLI or SQL); the
-- claim (sql/queries/worker.sql) spends it. Re-applied by every `webhooks migrate`.

-- The burst a bucket holds: half a second's worth, at least one POST. Over any 10 s a
-- subscription gets at most 10.5 seconds' worth.
CREATE OR REPLACE FUNCTION webhooks.rate_capacity(rate integer) RETURNS double precision
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT greatest(1.0, rate_capacity.rate * 0.5)
$$;

-- A subscription given a rate gets a full bucket; a changed rate keeps what the bucket
-- holds (up to the new burst); no rate, no bucket.
CREATE OR REPLACE FUNCTION webhooks.rate_bucket_sync() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.rate_limit IS NULL THEN
        DELETE FROM webhooks.rate_buckets b WHERE b.subscription_id = NEW.id;
    ELSE
        INSERT INTO webhooks.rate_buckets AS b (subscription_id, rate, tokens)
        VALUES (NEW.id, NEW.rate_limit, webhooks.rate_capacity(NEW.rate_limit))
            ON CONFLICT (subscription_id) DO UPDATE
           SET rate = excluded.rate,
               tokens = least(b.tokens, webhooks.rate_capacity(excluded.rate));
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS subscriptions_6_rate_insert ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_6_rate_insert AFTER INSERT ON webhooks.subscriptions
    FOR EACH ROW WHEN (NEW.rate_limit IS NOT NULL)
    EXECUTE FUNCTION webhooks.rate_bucket_sync();
DROP TRIGGER IF EXISTS subscriptions_6_rate_update ON webhooks.subscriptions;
CREATE TRIGGER subscriptions_6_rate_update AFTER UPDATE OF rate_limit ON webhooks.subscriptions
    FOR EACH ROW WHEN (NEW.rate_limit IS DISTINCT FROM OLD.rate_limit)
    EXECUTE FUNCTION webhooks.rate_bucket_sync();

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC;
