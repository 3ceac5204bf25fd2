-- 0009: why a subscription is inactive when the service, not its owner, stopped it (its
-- table detached or dropped, its events made private, auto-disabled), shown by the API,
-- `webhooks status` and the dashboard.

ALTER TABLE webhooks.subscriptions ADD COLUMN inactive_reason text;
