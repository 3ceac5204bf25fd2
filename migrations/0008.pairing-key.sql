-- Updates pair each new row with its own old row by the table's primary key, or a unique
-- index, that holds the id column (the id alone paired rows of different tenants sharing
-- an id, every old row with every new one). key_columns holds that key's columns, as
-- webhooks.install_capture found them. NULL for an attachment made before, until the next
-- `migrate` regenerates its capture function and fills it; it stays NULL for a table that
-- has no such key (attach refuses such a table now): updates then still pair on the id.
ALTER TABLE webhooks.attachments ADD COLUMN key_columns text[];
