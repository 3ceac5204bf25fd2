-- 0019: rate limits per subscription (docs/api.md, "Rate limits"). A subscription may carry
-- `rate_limit`, POSTs per second (1 to 10,000; NULL: none). Its bucket, one row per
-- limited subscription, is shared by every worker: the claim locks it, takes what it
-- allows (a burst of at most half a second's worth, refilled at the rate), and moves the
-- rest of what it found due past `horizon`, spaced at the rate. Kept by a trigger on
-- subscriptions (sql/ratelimit.sql).
ALTER TABLE webhooks.subscriptions
    ADD COLUMN rate_limit integer CHECK (rate_limit BETWEEN 1 AND 10000);
CREATE TABLE webhooks.rate_buckets (
    subscription_id bigint PRIMARY KEY
        REFERENCES webhooks.subscriptions (id) ON DELETE CASCADE,
    rate integer NOT NULL CHECK (rate BETWEEN 1 AND 10000),
    tokens double precision NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    horizon timestamptz NOT NULL DEFAULT '-infinity'
);
