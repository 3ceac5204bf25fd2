-- 0014: a strict subscription's deliveries that wait behind its first pending one are
-- parked out of the claim's due range (next_attempt_at 'infinity'; sql/ordering.sql says
-- who parks and who unparks them).
-- The parked deliveries, by subscription: the lifecycle round finds the subscriptions
-- that have some with a skip scan of this index, at a cost that grows with them, not
-- with every strict subscription or every parked delivery.
CREATE INDEX IF NOT EXISTS deliveries_parked_idx ON webhooks.deliveries (subscription_id, id)
    WHERE status = 'pending' AND next_attempt_at = 'infinity';
-- The queues that exist are parked: each due delivery of an active strict subscription
-- with an earlier pending one, unless it is in flight. A worker of the version before
-- this one does not unpark the next delivery when it records a head; the lifecycle
-- round, which `migrate` replaces too, does within a round (at most 5 s).
UPDATE webhooks.deliveries d
   SET next_attempt_at = 'infinity'
  FROM webhooks.subscriptions s
 WHERE s.id = d.subscription_id AND s.ordering = 'strict' AND s.active
   AND d.status = 'pending' AND d.lease_expires_at IS NULL AND d.next_attempt_at <= now()
   AND EXISTS (SELECT 1 FROM webhooks.deliveries p
                WHERE p.subscription_id = d.subscription_id AND p.status = 'pending'
                  AND p.id < d.id);
