-- Attempts in flight of inbox rows processed with ClaimLock (inbox.ProcessorConfig.ClaimMode).
-- A ClaimLock worker holds its rows with a row lock inside the processing transaction, so the
-- inbox row itself cannot record that an attempt started: anything the transaction writes is
-- undone when the process or its backend dies. Before running a handler the worker therefore
-- commits one row here, from another connection (the row lock does not cover this table). The
-- outcome deletes it in the processing transaction; a row left behind is an attempt that ended
-- its connection or process, and the next worker to lock the inbox row counts it, so a message
-- that kills its worker every time is parked after MaxAttempts instead of looping.
--
-- row_xmin is the inbox row version the attempt started from: any later change to the inbox
-- row (an outcome, an operator's replay or skip) makes a leftover row here stale, and stale
-- rows are ignored (and overwritten by the next start).
CREATE TABLE {{schema}}.inbox_attempts (
    inbox_id   bigint      PRIMARY KEY,
    attempt    integer     NOT NULL,          -- the attempt number that started
    row_xmin   xid         NOT NULL,          -- xmin of the inbox row when it started
    started_at timestamptz NOT NULL DEFAULT now()
);
