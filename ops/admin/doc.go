// Package admin serves an operator's page and JSON API for watermill-once: per consumer,
// charts of claims and duplicates over the last hour or day; the inbox by status with charts of
// its backlog and oldest pending age, filters, a detail view of a row and replay and skip; the
// outbox relays' lag over time, the topics they hold and the rows they rejected, each of which
// opens and, when the broker refused it, can be republished; failure groups (FAILED inbox rows,
// parked messages and rejected rows grouped by error) replayed, skipped or discarded a group at
// a time; and forgetting a retired relay. It
// is an http.Handler meant to be mounted in a service that already runs (next to /metrics or a
// debug mux); `wmonce` reads and acts through the same operations layer, so the page and the
// CLI answer alike.
//
//	h, err := admin.NewHandler(db, admin.Config{
//		Schema:      "wmonce",
//		Middlewares: []*once.Middleware{eo}, // optional: in-process duplicate rates
//		AllowWrites: false,                             // read-only (the default)
//	}, logger)
//	defer h.Close() // stops the sampling behind the charts
//	mux.Handle("/wmonce/", http.StripPrefix("/wmonce", h))
//
// # API
//
//	GET  /api/status                schema version, latest version, whether writes are allowed
//	GET  /api/consumers             claims per consumer (count, newest) + in-process counts
//	GET  /api/inbox/stats           inbox rows per consumer and status, oldest pending age
//	GET  /api/inbox?consumer=C[&status=FAILED,PENDING][&key=K][&message=M][&topic=T][&error=E]
//	     [&received_after=T][&received_before=T][&after=ID][&limit=N]
//	GET  /api/inbox/{id}            one row with payload and metadata
//	GET  /api/outbox                backlog and lag per relay, a position of another cluster (moved, finding), rejected rows
//	GET  /api/outbox/rejected[?relay=R][&rejected_after=T][&rejected_before=T][&after=OFFSET][&limit=N]
//	GET  /api/outbox/rejected/{offset}[?relay=R]   one rejected row with payload and metadata
//	GET  /api/history[?window=hour|day][&consumer=C][&relay=R]   the charts' series
//	GET  /api/dedupe?consumer=C&message=M   was M processed by C, and when
//	GET  /api/failures              failure groups, the largest first: {groups, max_rows, left_out}
//	POST /api/inbox/replay          {consumer, statuses, ids, message_ids, ordering_key, topic,
//	                                error_contains, dry_run} -> {action, consumer, dry_run, rows}
//	POST /api/inbox/skip            the same with reason (required) and all
//	POST /api/outbox/republish      {relay, offsets | all, remove_metadata, dry_run} ->
//	                                {relay, dry_run, republished, offsets, undecodable}
//	POST /api/outbox/forget         {relay, dry_run} -> {relay, dry_run, backlog, held, stats}; 409
//	                                while the relay runs, 404 for a name without a position
//	POST /api/failures/act          {kind, fingerprint, action, ids, reason, dry_run} -> {kind,
//	                                fingerprint, action, dry_run, rows, ids, relay, undecodable}: replay, skip
//	                                or discard one group; dry_run lists the rows, ids narrows
//	                                the action to them; the rows its transaction changed; 404
//	                                for a group with no row to act on (unknown fingerprint, or
//	                                rows another action took first), as `wmonce failures` exits 1
//
// Errors are JSON ({"error": "..."}) with 400 for input the caller must fix, 403 for refused
// writes, 404 for a missing row and 503 when the schema lacks its tables (every endpoint but
// /api/status, which answers version 0 and the command to run). Input is checked as it
// arrives, before any endpoint reads it, so that nothing reaches the database as other text
// than was sent: every query string must parse (a malformed escape such as %zz, or a ";", is
// 400, not a parameter left out), and every parameter name and value, read or not, must be
// text (wmonce.CheckText: no NUL, valid UTF-8, so %FF is 400); a write's JSON body must be valid
// UTF-8 and hold no \u escape of half a UTF-16 surrogate pair (\ud800 alone; a pair such as
// \ud83d\ude00 is one character and passes), one JSON value, at most MaxBodyBytes (413
// beyond). A JSON field holding a NUL (\u0000) is 400 too, and so is a consumer name longer
// than wmonce.MaxNameLength bytes: the same rules as `wmonce` (wmonce.CheckText, wmonce.CheckName). Times
// (received_after, rejected_before, ...) are RFC 3339; an "after" bound is inclusive, a
// "before" bound exclusive.
//
// # Charts: what each series measures
//
// GET /api/history divides the last hour into 60 one-minute buckets, or the last day into 96
// buckets of 15 minutes, and returns one value per bucket for each series:
//
//   - claims: claim rows (processed_messages and processed_messages_daily) whose processed_at,
//     the start of the transaction that applied the message, falls in the bucket. This is
//     history kept by the database: every process's claims, back to whatever retention kept.
//   - duplicates: copies an effectively-once middleware skipped because the key was claimed,
//     in any process. A duplicate leaves no claim row (the claim is INSERT ... ON CONFLICT DO
//     NOTHING), so each middleware adds its duplicates per consumer and minute to
//     duplicates_per_minute (internal/claims.DuplicateHistory), at most once a second: the standalone
//     page (`wmonce admin`) charts them with no Config.Middlewares. Kept two days; the last
//     second of a process that exits without Close is lost.
//   - inbox pending, failed and oldest_pending_age_seconds (inbox.Ops.AllStats), relay backlog
//     and lag_seconds (outbox.Stats: the age of the oldest row the relay has not forwarded):
//     the database keeps only their present value, so the handler samples them too, and a
//     bucket holds the largest value sampled in it.
//
// A null value is a bucket no sample covers (before sampling began, or a part that could not
// be read). Claims are never null.
//
// # Sampling
//
// NewHandler starts a goroutine that samples every Config.SampleInterval (by default
// DefaultSampleInterval, 15s) until Close, into memory: every sample of the last hour, and for
// the last day one entry per five minutes (largest gauges): about 530
// entries at the default interval. A sample is three queries: the inbox's unfinished rows through its work index, and
// outbox.Stats (each relay's unforwarded rows, the rejected count), whose cost grows with the
// backlogs, not with the tables.
// Sampling in the handler rather than computing from row timestamps was chosen because relay
// lag exists only as a present value (outbox.Stats: the relay keeps one position, not its
// past); the inbox backlog could be rebuilt from received_at and
// finished_at, but replays reset those and retention deletes finished rows, so it would be
// wrong exactly when an operator looks. The price: the sampled charts start when the handler
// starts, forget on restart, and show what this process saw. For a fleet-wide, durable
// history, scrape the metrics package into Prometheus (ops/deploy/grafana has a dashboard). A sampler that fails because the schema
// lacks its tables logs that once at info level; other failures are logged as errors, again
// only when the error changes.
//
// # Safety
//
// Read-only by default: the POST endpoints (replay, skip, republish, forget) answer 403 until
// Config.AllowWrites is set, and the page hides its buttons. A write must be a POST with Content-Type application/json and
// the header X-Wmonce-Admin: 1. An HTML form on another site can send neither, and a
// cross-site script that tries needs a CORS preflight this handler never answers, so a page
// the operator happens to visit cannot replay or skip through the operator's browser. The
// page is served with a Content-Security-Policy that allows only its own script and
// stylesheet, and it inserts every value as text: payloads and error messages come from
// producers. Its charts are SVG elements built by its script and styled by class, with no
// inline style, library or external asset. The detail view indents JSON payloads without
// parsing their values (a number wider than JavaScript's doubles is shown as written), shows
// payloads that are not UTF-8 as a hex dump, and replaces control and bidirectional-override
// characters with \u escapes so they cannot hide or reorder text.
//
// The handler authenticates no one. Mount it behind whatever guards your other operator
// endpoints (an internal listener, a reverse proxy with SSO, your own middleware).
//
// Replay and skip go through inbox.Ops: one statement each, never touching IN_PROGRESS rows,
// waking the processors. Replaying a FAILED row makes its handler run again, once; the page
// offers replay only for FAILED and SKIPPED rows (DONE rows can be replayed through the API
// with an explicit status, which applies their effects a second time). Republish and forget go
// through package outbox (RepublishRejected, ForgetRelay): republishing stores a refused row
// again at the end of the outbox, through the outbox Writer's own insert (its detail view offers it only for rows the broker refused:
// an undecodable row would only be rejected again), and forgetting a relay first shows, from a
// dry run, what it had not forwarded.
//
// # Cost
//
// Claim counts and DONE/SKIPPED counts scan their tables; on tables of many millions of rows
// a page load takes seconds. The claims chart scans processed_messages for the window when no
// consumer is given (no index leads with processed_at; EXPLAIN ANALYZE on the project's test
// server: 126 ms for the last hour of a synthetic 300,000-row table) and uses the (consumer,
// processed_at) index for one consumer (0.3 ms on the same table); processed_messages_daily is
// always scanned.
// Every request and every sample is bounded by Config.QueryTimeout. Duplicate rates come from
// the middlewares' in-process counters: they cover this process since it started, not the
// whole fleet (use the metrics package for that).
package admin
