-- 0011: a subscription's compiled filter is stored once, in webhooks.subscriptions.
-- webhooks.subscription_events carried a copy of it per event (a 41 KB filter on 100
-- events was 4 MB of registry); it now only says whether the subscription has one, and
-- fan-out reads the filter from the subscription (sql/queries/fanout.sql).
ALTER TABLE webhooks.subscription_events ADD COLUMN filtered boolean NOT NULL DEFAULT false;
UPDATE webhooks.subscription_events SET filtered = true WHERE filter_path IS NOT NULL;
ALTER TABLE webhooks.subscription_events DROP COLUMN filter_path;
