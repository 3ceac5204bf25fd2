-- Queries of `webhooks secrets encrypt`; loaded by service.db.queries().

-- name: secrets_count --
SELECT count(*) FROM webhooks.subscriptions

-- name: secrets_batch --
SELECT id, secret FROM webhooks.subscriptions
 WHERE id > %(after)s
 ORDER BY id
 LIMIT %(limit)s
   FOR UPDATE

-- name: secrets_update --
UPDATE webhooks.subscriptions SET secret = %(secret)s WHERE id = %(id)s
