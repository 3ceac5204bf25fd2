-- 0015: room on each page of webhooks.subscriptions for the worker's updates. The recorder
-- rewrites each subscription's row (its last_* fields, failure lifecycle and document)
-- after every batch of its outcomes. On packed pages (the default fill factor of 100) a
-- new version seldom fits beside the old one, so the update goes to another page and
-- adds an entry to every index of the table: with 10,000 subscriptions each recorded in
-- turn, 5-12% of those updates stayed on their page (HOT); at 70, 87-99% once the table
-- had settled, a record of 100 outcomes took 3.35 ms instead of 3.7-3.9, and the table
-- was a third smaller. Only pages written from now on keep the room: existing ones fill
-- it as their rows move, or at once with VACUUM FULL (docs/operations.md).
ALTER TABLE webhooks.subscriptions SET (fillfactor = 70);
