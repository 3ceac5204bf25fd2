-- 0016: the queue's floor. Every queue statement (the claim, the fan-out's probe of what is
-- due) read or set up a scan of every day's deliveries partition, with the default
-- retention ten of them, though pending deliveries are almost all in the last day's. The
-- floor is a time before which no delivery is pending: the worker passes it to those
-- statements, which then leave the older partitions out when they start.
-- webhooks.refresh_queue_floor() (sql/partitions.sql) raises it to the oldest day holding
-- a pending delivery, never past yesterday's start; webhooks.redeliver and webhooks.recover
-- lower it when they make an older delivery pending. One row; '-infinity' until the first
-- refresh.
CREATE TABLE webhooks.queue_floor (
    single boolean PRIMARY KEY DEFAULT true CHECK (single),
    since timestamptz NOT NULL
);
INSERT INTO webhooks.queue_floor (since) VALUES ('-infinity');
