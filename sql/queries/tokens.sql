-- Queries of API tokens; loaded by service.db.queries().

-- name: token_insert --
INSERT INTO webhooks.tokens (owner, tenant, token_hash)
VALUES (%(owner)s, %(tenant)s, %(token_hash)s)
RETURNING id

-- name: token_list --
SELECT id, owner, tenant, created_at, revoked_at
  FROM webhooks.tokens
 ORDER BY id

-- name: token_revoke --
UPDATE webhooks.tokens
   SET revoked_at = coalesce(revoked_at, now())
 WHERE id = %(id)s
RETURNING id

-- name: token_lookup --
SELECT id, owner, tenant, token_hash
  FROM webhooks.tokens
 WHERE token_hash = %(token_hash)s AND revoked_at IS NULL
