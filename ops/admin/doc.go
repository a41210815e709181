// Package admin serves an operator's page and JSON API for watermill-once: claims and
// duplicates per consumer, the inbox by status, the relays' lag, held topics and rejected
// rows, and failure groups, with charts over the last hour or day and, when allowed, the
// actions an operator takes on them. It is an http.Handler to mount in a service that already
// runs; `wmonce admin` serves it on its own.
//
//	h, err := admin.NewHandler(db, admin.Config{Schema: "wmonce"}, logger)
//	defer h.Close() // stops the sampling behind the charts
//	mux.Handle("/wmonce/", http.StripPrefix("/wmonce", h))
//
// What it guarantees, and where that stops:
//
//   - Reads change nothing. Writes are answered 403 unless Config.AllowWrites is set, and even
//     then must be a POST with a JSON body and the WriteHeader header, which a page on another
//     site cannot send through an operator's browser.
//   - Every write goes through the owner's operation, in its transaction, as `wmonce` does (both
//     call one operations layer): replay and skip change inbox rows through inbox.Ops (one
//     statement, never an IN_PROGRESS row; a replayed row's handler runs again, once);
//     republish stores rejected rows again at the end of the outbox and forget deletes a
//     retired relay's position, through package outbox; a failure-group action replays, skips
//     or discards the rows of one group (or exactly those a dry run listed) through the
//     inbox's or the outbox's group operation. Each answers the rows its own transaction
//     changed; a dry run changes nothing.
//   - Input PostgreSQL would not store as the text that was sent (NUL, invalid UTF-8, half a
//     surrogate pair), a malformed query string and a body over MaxBodyBytes are refused (400,
//     413) before any endpoint reads them, never altered.
//   - It authenticates no one: mount it behind whatever guards your operator endpoints.
//   - The backlog and lag charts are samples this handler keeps in memory: they start with it
//     and show what this process saw. Claims and duplicates come from the database. For a
//     durable, fleet-wide history, scrape the metrics package.
//
// The endpoints and their JSON, what each chart measures, sampling and cost: docs/operations.md,
// "The admin page".
package admin
