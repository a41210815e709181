// Package admin serves an operator's page and JSON API for watermill-once: consumers and
// their duplicate rates, the inbox by status with replay and skip, and the outbox lag. It is an
// http.Handler meant to be mounted in a service that already runs (next to /metrics or a
// debug mux), and the same read functions back `wmonce status`.
//
//	h, err := admin.NewHandler(db, admin.Config{
//		Schema:      "wmonce",
//		Middlewares: []*middleware.EffectivelyOnce{eo}, // optional: duplicate rates
//		AllowWrites: false,                             // read-only (the default)
//	}, logger)
//	mux.Handle("/wmonce/", http.StripPrefix("/wmonce", h))
//
// # API
//
//	GET  /api/status                schema version, latest version, whether writes are allowed
//	GET  /api/consumers             claims per consumer (count, newest) + in-process counts
//	GET  /api/inbox/stats           inbox rows per consumer and status, oldest pending age
//	GET  /api/inbox?consumer=C[&status=FAILED,PENDING][&key=K][&message=M][&topic=T][&error=E][&after=ID][&limit=N]
//	GET  /api/inbox/{id}            one row with payload and metadata
//	GET  /api/outbox                backlog and lag per relay, rejected rows
//	GET  /api/dedupe?consumer=C&message=M   was M processed by C, and when
//	POST /api/inbox/replay          ChangeRequest -> ChangeResponse (dry_run supported)
//	POST /api/inbox/skip            ChangeRequest with reason -> ChangeResponse
//
// Errors are JSON ({"error": "..."}) with 400 for input the caller must fix, 403 for refused
// writes, 404 for a missing row and 503 when the schema lacks its tables (every endpoint but
// /api/status, which answers version 0 and the command to run). Text parameters and JSON
// fields are refused with 400 when they hold a NUL byte or invalid UTF-8, and a consumer name
// when it is longer than MaxConsumerBytes: the same rules as `wmonce` (CheckText,
// CheckConsumer).
//
// # Safety
//
// Read-only by default: the POST endpoints answer 403 until Config.AllowWrites is set, and
// the page hides its buttons. A write must be a POST with Content-Type application/json and
// the header X-Wmonce-Admin: 1. An HTML form on another site can send neither, and a
// cross-site script that tries needs a CORS preflight this handler never answers, so a page
// the operator happens to visit cannot replay or skip through the operator's browser. The
// page is served with a Content-Security-Policy that allows only its own script, and it
// inserts every value as text: payloads and error messages come from producers.
//
// The handler authenticates no one. Mount it behind whatever guards your other operator
// endpoints (an internal listener, a reverse proxy with SSO, your own middleware).
//
// Replay and skip go through inbox.Ops: one statement each, never touching IN_PROGRESS rows,
// waking the processors. Replaying a FAILED row makes its handler run again, once; the page
// offers replay only for FAILED and SKIPPED rows (DONE rows can be replayed through the API
// with an explicit status, which applies their effects a second time).
//
// # Cost
//
// Claim counts and DONE/SKIPPED counts scan their tables; on tables of many millions of rows
// a page load takes seconds. Every request is bounded by Config.QueryTimeout. Duplicate rates
// come from the middlewares' in-process counters: they cover this process since it started,
// not the whole fleet (use the metrics package for that).
package admin
