-- The W3C trace context (traceparent, tracestate) of the span that recorded an intent, so that
-- the sender's span joins the trace of the handler that decided on the effect. NULL: recorded
-- without a span.
ALTER TABLE {{schema}}.intents ADD COLUMN trace_parent text, ADD COLUMN trace_state text;
