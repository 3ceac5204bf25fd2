-- Queries of the REST API's secret rotation (service/api/rotation.py); loaded by
-- service.db.queries(). Scoped like every subscription query (sql/queries/api.sql).

-- name: rotation_target --
SELECT id, target
  FROM webhooks.subscriptions
 WHERE id = %(id)s AND owner = %(owner)s
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)

-- name: rotation_rotate --
-- The verified new secret (sealed) replaces the current one, which becomes the previous
-- secret and keeps signing for %(overlap)s seconds (none when 0). Nothing changes if the
-- subscription is gone, or its target is no longer the one verified.
-- Returns the subscription as GET shows it (its doc, which the row's trigger wrote).
UPDATE webhooks.subscriptions AS s
   SET previous_secret = CASE WHEN %(overlap)s::float8 > 0 THEN s.secret END,
       previous_secret_expires_at = CASE WHEN %(overlap)s::float8 > 0
                                         THEN now() + make_interval(secs => %(overlap)s)
                                    END,
       secret = %(secret)s
 WHERE id = %(id)s AND owner = %(owner)s
   AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
   AND target = %(target)s
RETURNING s.doc
