-- 0018: the writer's W3C trace context (SET LOCAL webhooks.traceparent, webhooks.tracestate),
-- kept with each captured statement (outbox) and each event (events), so that every
-- attempt's POST continues the application's trace (docs/deliveries.md, "Trace context").
-- Stored as the writer gave them (the tracestate cut to 513 characters by the capture);
-- the worker sends only well-formed values and ignores the rest.
ALTER TABLE webhooks.outbox
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text;
ALTER TABLE webhooks.events
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text;
