-- Connections: what the service does about its own backends; loaded by
-- service.db.queries().

-- name: end_abandoned --
-- Ends the backends of connections the service abandoned (service.store.deadline): behind
-- a proxy that hangs, the server still sees them alive, and one that stopped in the middle
-- of a pipeline or a result holds its transaction's locks (the fan-out's among them) for
-- as long as the proxy holds on; no idle timeout reaches it. Only the service's own role's
-- backends of this database are ended, and only those that started before they were
-- abandoned (%(ages)s: seconds since each was, by the client's clock; a pid the server
-- gave a new backend since then is left alone).
SELECT count(pg_terminate_backend(a.pid))::int AS ended
  FROM pg_stat_activity a
  JOIN unnest(%(pids)s::int[], %(ages)s::float8[]) AS s (pid, age) ON s.pid = a.pid
 WHERE a.usename = current_user AND a.datname = current_database()
   AND a.pid <> pg_backend_pid()
   AND a.backend_start <= now() - make_interval(secs => s.age)
