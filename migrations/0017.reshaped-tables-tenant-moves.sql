-- 0017: what keeps an attached table from lending the service's rights, and a row that
-- changes tenant apart from both tenants.
--
-- attachments.key_index: the index that pairs an UPDATE's rows (webhooks.pairing_index),
-- recorded so that the DDL guard knows a statement dropped it (by the time an event
-- trigger sees a dropped index, its catalog rows are gone). Filled by every
-- `webhooks migrate` (webhooks.refresh_capture).
-- attachments.row_security: whether the table had row-level security when it was
-- attached; enabling it later is refused by the DDL guard.
-- attachments.ddl_xid: the transaction in which the service's own code last dropped the
-- table's capture triggers (to write them again, or to detach): the DDL guard lets that
-- transaction's DROP TRIGGER pass and refuses any other role's.
-- outbox.audience: which subscriptions a captured statement's changes are for when rows
-- moved between tenants (sql/triggers/capture.sql): NULL every one, 'untenanted' only
-- those made without a tenant (the move as one .update), 'tenanted' only tenant-scoped ones
-- (the old tenant's .delete and the new tenant's .create).
ALTER TABLE webhooks.attachments
    ADD COLUMN key_index regclass,
    ADD COLUMN row_security boolean NOT NULL DEFAULT false,
    ADD COLUMN ddl_xid xid8;
UPDATE webhooks.attachments a
   SET row_security = c.relrowsecurity
  FROM pg_catalog.pg_class c
 WHERE c.oid = a.table_oid;
ALTER TABLE webhooks.outbox
    ADD COLUMN audience text CHECK (audience IN ('untenanted', 'tenanted'));
