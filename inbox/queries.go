package inbox

import (
	"time"

	"github.com/wmonce/watermill-once/internal/pgnotify"
	"github.com/wmonce/watermill-once/pgtx"
)

// unfinished lists, in SQL, the statuses that hold back later rows of the same ordering key.
// It must match the predicate of inbox_key_head_idx (migration 002).
const unfinished = `('PENDING', 'IN_PROGRESS', 'FAILED')`

// notifyChannel is the LISTEN/NOTIFY channel of an inbox schema. NOTIFY payloads carry the
// consumer name, so processors of other consumers ignore the wake-up. PostgreSQL truncates
// identifiers at 63 bytes; long schema names are hashed to stay under it (pgnotify.Channel).
func notifyChannel(schema string) string { return pgnotify.Channel("wmonce_inbox_", schema) }

// micros turns a duration into the bigint the queries multiply by interval '1 microsecond', so
// that every timestamp is computed by the database clock, never by a worker's.
func micros(d time.Duration) int64 { return d.Microseconds() }

// leaseExpired starts the last_error of a row whose lease the reaper took back: a claim
// recognises by it a row whose last attempt may have killed its worker.
const leaseExpired = "lease expired during attempt "

// queries holds every statement with the schema-qualified table quoted in.
type queries struct {
	table   string
	channel string

	ingest       string
	claim        string
	complete     string
	completeMany string
	owned        string
	fail         string
	release      string
	renew        string
	reap         string
}

func newQueries(schema string) queries {
	t := pgtx.QualifiedName(schema, "inbox")
	// A paused consumer (Ops.Pause, migration 014) claims nothing: one probe of a tiny table's
	// primary key in the claim statement itself, so a pause holds from the first claim that
	// starts after it commits, in every processor, without a round trip of its own.
	notPaused := `NOT EXISTS (SELECT 1 FROM ` + pgtx.QualifiedName(schema, "inbox_paused") + ` WHERE consumer = $1)`
	return queries{
		table:   t,
		channel: notifyChannel(schema),

		// One statement, one implicit transaction, one round trip per batch: insert every row
		// in arrival order (ids follow it), skip keys already present, and NOTIFY once if
		// anything was new. Notifications are delivered at commit.
		// $9 holds the age guard's reason per row ('' for none): such a row, if its key is
		// new, is stored parked as FAILED with the reason, and its key is returned. $10 holds
		// when each row is due ('' for now: a message without delay metadata): its first
		// attempt waits until then (not-before processing, outbox.MetadataDelayedUntil).
		ingest: `WITH ins AS (
    INSERT INTO ` + t + ` (consumer, message_id, message_uuid, ordering_key, topic, payload, metadata, status, last_error, next_attempt_at)
    SELECT $1::text, k, u, NULLIF(o, ''), tp, p, m::jsonb,
        CASE WHEN e = '' THEN 'PENDING' ELSE 'FAILED' END, NULLIF(e, ''), greatest(now(), NULLIF(d, '')::timestamptz)
    FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $9::text[], $10::text[]) WITH ORDINALITY AS x(k, u, o, tp, p, m, e, d, n)
    ORDER BY n
    ON CONFLICT (consumer, message_id) DO NOTHING
    RETURNING message_id, status
)
SELECT c.n, c.parked, CASE WHEN c.n > c.p THEN pg_notify($8, $1::text)::text END FROM (
    SELECT count(*) AS n, count(*) FILTER (WHERE status = 'FAILED') AS p,
        coalesce(json_agg(message_id) FILTER (WHERE status = 'FAILED'), '[]')::text AS parked
    FROM ins) c`,

		// Due PENDING rows in received order, skipping rows another claim holds locked, and
		// skipping rows that have an older unfinished row of the same ordering key. $5 is the
		// claim floor (see Processor.claimAfter).
		claim: `WITH due AS (
    SELECT i.id FROM ` + t + ` i
    WHERE i.consumer = $1 AND i.status = 'PENDING' AND i.next_attempt_at <= now() AND i.id > $5 AND ` + notPaused + `
      AND (i.ordering_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM ` + t + ` o
          WHERE o.consumer = i.consumer AND o.ordering_key = i.ordering_key
            AND o.status IN ` + unfinished + ` AND o.id < i.id))
    ORDER BY i.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE ` + t + ` r SET status = 'IN_PROGRESS', claim_token = $3,
    lease_until = now() + $4::bigint * interval '1 microsecond', attempts = r.attempts + 1
FROM due WHERE r.id = due.id
RETURNING r.id, r.message_id, r.message_uuid, coalesce(r.ordering_key, ''), r.topic, r.payload, r.metadata::text, r.attempts, r.received_at,
    CASE WHEN starts_with(r.last_error, '` + leaseExpired + `') THEN r.attempts - 1 ELSE 0 END`,

		complete: `UPDATE ` + t + ` SET status = 'DONE', finished_at = statement_timestamp(), claim_token = NULL, lease_until = NULL
WHERE id = $1 AND claim_token = $2`,
		completeMany: `UPDATE ` + t + ` SET status = 'DONE', finished_at = statement_timestamp(), claim_token = NULL, lease_until = NULL
WHERE id = ANY($1::bigint[]) AND claim_token = $2`,
		owned: `SELECT id FROM ` + t + ` WHERE id = ANY($1::bigint[]) AND claim_token = $2`,

		// $3: permanent error; $4: attempt limit; $5: backoff in microseconds.
		fail: `UPDATE ` + t + ` SET
    status = CASE WHEN $3::bool OR attempts >= $4 THEN 'FAILED' ELSE 'PENDING' END,
    next_attempt_at = now() + $5::bigint * interval '1 microsecond',
    last_error = $6, claim_token = NULL, lease_until = NULL
WHERE id = $1 AND claim_token = $2
RETURNING status`,

		// Gives claimed rows back without counting the attempt (shutdown, lost connection).
		release: `UPDATE ` + t + ` r SET status = 'PENDING', claim_token = NULL, lease_until = NULL,
    attempts = greatest(r.attempts - 1, 0), next_attempt_at = now() + $3::bigint * interval '1 microsecond'
FROM unnest($1::bigint[], $2::bigint[]) AS c(id, token)
WHERE r.id = c.id AND r.claim_token = c.token
RETURNING r.id`,

		// Extends the leases a worker still holds. Rows locked right now are being completed
		// by their worker: skip them rather than wait. The rows to renew are an array computed
		// once (an InitPlan), never a subquery joined to the table: a plan made while the inbox
		// was empty ran that subquery again for every row of the table (3.6 s a renewal at
		// 50,000 rows; 0.1 ms with an index, 72 ms even with that stale plan in this shape).
		renew: `UPDATE ` + t + ` r SET lease_until = now() + $3::bigint * interval '1 microsecond'
WHERE r.id = ANY(ARRAY(SELECT i.id FROM ` + t + ` i JOIN unnest($1::bigint[], $2::bigint[]) AS c(id, token)
        ON i.id = c.id AND i.claim_token = c.token
      FOR UPDATE OF i SKIP LOCKED))`,

		// Takes back claims whose lease ran out. The attempt the lost worker started stays
		// counted, so a message that kills its worker every time is parked after the limit.
		// The expired rows are an array computed once, as in renew: with a subquery joined to
		// the table, a plan made while the inbox was empty ran it for every row (397 s for one
		// reap at 50,000 rows).
		reap: `UPDATE ` + t + ` r SET
    status = CASE WHEN r.attempts >= $2 THEN 'FAILED' ELSE 'PENDING' END,
    claim_token = NULL, lease_until = NULL, next_attempt_at = now(),
    last_error = '` + leaseExpired + `' || r.attempts || ': the worker stalled, died or outran its lease'
WHERE r.id = ANY(ARRAY(SELECT id FROM ` + t + `
      WHERE consumer = $1 AND status = 'IN_PROGRESS' AND lease_until < now()
      LIMIT 1000 FOR UPDATE SKIP LOCKED))
RETURNING r.id, r.status`,
	}
}
