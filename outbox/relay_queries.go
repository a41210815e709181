package outbox

import "github.com/wmonce/watermill-once/pgtx"

// emptySnapshot sees no transaction: the position of a relay that has published nothing.
const emptySnapshot = "1:1:"

// relayQueries are a relay's statements on the tables of its schema (package migrate), built
// once by NewRelay. Every name in them is quoted; every value is a parameter.
type relayQueries struct {
	// The position: registering it, reading it (and asking the Writers to notify), advancing it.
	register, sourceOf, served, position, positionIdle, advance string
	// The outbox: reading a round (and the rest of one larger than a batch), setting a row
	// aside in outbox_rejected.
	readRound, readRest, reject string
	// Held topics (hold.go).
	hold, heldTopics, heldRead, heldDelete string
	// Delayed rows (delay.go).
	delay, delayedDue, delayedRead, delayedDelete, delayedHold string
	// Pause (pause.go).
	paused string
	// The system identifier of the cluster the position is recorded on (relay_origin.go).
	recordSystem string
}

func newRelayQueries(schema string) relayQueries {
	table := pgtx.QualifiedName(schema, "outbox")
	offsets := pgtx.QualifiedName(schema, "outbox_offsets")
	held := pgtx.QualifiedName(schema, "outbox_held")
	rejected := pgtx.QualifiedName(schema, "outbox_rejected")
	delayed := pgtx.QualifiedName(schema, "outbox_delayed")
	return relayQueries{
		// Registers the position for the relay's Source ($2) and returns the Source the position
		// belongs to: a new one is this relay's, one registered before migration 012 (NULL) is
		// adopted. NULL when a concurrent registration is not visible to the statement yet.
		register: `WITH ins AS (
    INSERT INTO ` + offsets + ` (consumer_group, offset_acked, last_processed_transaction_id, snapshot, source, offset_high)
    VALUES ($1, 0, '1', '` + emptySnapshot + `', $2, ` + offsetHigh(schema) + `) ON CONFLICT DO NOTHING RETURNING source),
adopt AS (UPDATE ` + offsets + ` SET source = $2 WHERE consumer_group = $1 AND source IS NULL RETURNING source)
SELECT coalesce((SELECT source FROM ins), (SELECT source FROM adopt), (SELECT source FROM ` + offsets + ` WHERE consumer_group = $1))`,
		sourceOf: `SELECT source FROM ` + offsets + ` WHERE consumer_group = $1`,
		// Whether some relay forwards source $1 (a relay older than migration 012 forwards all).
		served: `SELECT EXISTS (SELECT 1 FROM ` + offsets + ` WHERE source IS NULL OR source = $1)`,
		// The position, and whether the relay is paused (pause.go).
		position: `SELECT snapshot::text, target_snapshot::text, target_offset, paused_at IS NOT NULL FROM ` + offsets + ` WHERE consumer_group = $1`,
		// The position read of an idle relay's round also asks Writers to notify it until
		// idle_until ($2 microseconds from now, renewed by every idle round). It commits before
		// the round reads the outbox, so a transaction that stores after it notifies, and one that
		// committed before it is read by this round. A paused relay asks for nothing: Writers do
		// not pay for notifications it would not act on.
		positionIdle: `UPDATE ` + offsets + ` SET idle_until = CASE WHEN paused_at IS NULL THEN now() + $2::bigint * interval '1 microsecond' ELSE idle_until END
WHERE consumer_group = $1 RETURNING snapshot::text, target_snapshot::text, target_offset, paused_at IS NOT NULL`,
		// One statement takes the snapshot and reads with it: pg_current_snapshot() returns the
		// statement's active snapshot, the one its scans see, so the rows read are exactly the
		// transactions visible now and not in prev ($1): those in prev's in-progress list, and
		// those from prev's xmax up to the current xmax. Each branch is a range of the
		// (transaction_id, offset) primary key, bounded on both sides so that a generic plan
		// estimates it small too; "offset" + 0 keeps the planner from walking the whole outbox
		// in "offset" order instead. Only the keys of the round are sorted; the rows are read
		// for the batch alone, one primary-key lookup each: the LATERAL ... LIMIT 1 keeps the
		// planner from hashing the batch (estimated at LIMIT $2 rows) against a scan of the whole
		// outbox, which it chose at 20,000 rows, a round then costing milliseconds instead of
		// 0.1 ms (TestRelayReadsARoundByIndexInEveryPlanMode). The relay runs it with
		// replan.For: a plan cached while the outbox was empty scans it too. A round with no rows still returns one (offset NULL) carrying
		// the snapshot: its in-progress list tells an idle relay whom to wait for (wakeup).
		// Rows of another source than $3 are returned without payload: the relay only passes
		// over them.
		readRound: `SELECT cur.snap, t."offset", t.transaction_id::text, t.uuid, t.source,
    CASE WHEN t.source = $3 THEN t.payload::text END, CASE WHEN t.source = $3 THEN t.metadata::text END
FROM (SELECT pg_current_snapshot()::text AS snap) cur
LEFT JOIN (
    SELECT t."offset", t.transaction_id, t.uuid, t.source, t.payload, t.metadata
    FROM (
        SELECT "offset", transaction_id FROM (
            SELECT "offset", transaction_id FROM ` + table + `
            WHERE transaction_id = ANY(ARRAY(SELECT pg_snapshot_xip($1::text::pg_snapshot)))
            UNION ALL
            SELECT "offset", transaction_id FROM ` + table + `
            WHERE transaction_id >= pg_snapshot_xmax($1::text::pg_snapshot)
              AND transaction_id < pg_snapshot_xmax(pg_current_snapshot())
        ) round
        ORDER BY "offset" + 0
        LIMIT $2
    ) batch
    CROSS JOIN LATERAL (
        SELECT o."offset", o.transaction_id, o.uuid, o.source, o.payload, o.metadata FROM ` + table + ` o
        WHERE o.transaction_id = batch.transaction_id AND o."offset" = batch."offset" LIMIT 1
    ) t
) t ON true
ORDER BY t."offset"`,
		// The rest of a round larger than one batch: visible in target ($2), not in prev ($1),
		// after the last offset published ($3). Walks the "offset" index (migration 006).
		readRest: `SELECT "offset", transaction_id::text, uuid, source,
    CASE WHEN source = $5 THEN payload::text END, CASE WHEN source = $5 THEN metadata::text END
FROM ` + table + `
WHERE "offset" > $3
  AND (transaction_id = ANY(ARRAY(SELECT pg_snapshot_xip($1::text::pg_snapshot)))
       OR transaction_id >= pg_snapshot_xmax($1::text::pg_snapshot))
  AND transaction_id < pg_snapshot_xmax($2::text::pg_snapshot)
  AND pg_visible_in_snapshot(transaction_id, (SELECT $2::text::pg_snapshot))
ORDER BY "offset"
LIMIT $4`,
		// Compare-and-set on the whole position. The legacy columns keep a conservative
		// watermark for older readers: every row below pg_snapshot_xmin(snapshot) is published.
		// A new snapshot is recorded with the offset sequence's value read now, after the
		// snapshot was taken (offset_high, migration 019).
		// A position update after a publish also withdraws the relay's request for notifications
		// ($8): a relay that publishes is busy, and asks again once it finds nothing.
		advance: `UPDATE ` + offsets + ` SET snapshot = $2::text::pg_snapshot, target_snapshot = $3::text::pg_snapshot,
    target_offset = $4, last_processed_transaction_id = pg_snapshot_xmin($2::text::pg_snapshot), offset_acked = 0,
    offset_high = CASE WHEN snapshot::text = $2 THEN offset_high ELSE ` + offsetHigh(schema) + ` END,
    idle_until = CASE WHEN $8 THEN NULL ELSE idle_until END
WHERE consumer_group = $1 AND snapshot::text = $5
  AND target_snapshot::text IS NOT DISTINCT FROM $6 AND target_offset IS NOT DISTINCT FROM $7`,
		reject: `INSERT INTO ` + rejected + ` (relay, "offset", transaction_id, uuid, payload, metadata, error, topic, source)
VALUES ($1, $2, $3::xid8, $4, nullif($5, '')::json, $6::json, $7, nullif($8, ''), $9) ON CONFLICT DO NOTHING`,
		// The rows are copied from the outbox (by primary key), in the order given, so that seq
		// follows the relay's order. A row held already (the position update after holding it
		// failed, and the batch is read again) is not copied twice.
		hold: `INSERT INTO ` + held + ` (relay, topic, "offset", transaction_id, uuid, source, created_at, payload, metadata)
SELECT $1, $2, o."offset", o.transaction_id, o.uuid, o.source, o.created_at, o.payload, o.metadata
FROM unnest($3::bigint[], $4::text[]) WITH ORDINALITY AS k(off, xid, n)
JOIN ` + table + ` o ON o.transaction_id = k.xid::xid8 AND o."offset" = k.off
ORDER BY k.n
ON CONFLICT (relay, transaction_id, "offset") DO NOTHING`,
		heldTopics: `SELECT DISTINCT topic FROM ` + held + ` WHERE relay = $1`,
		heldRead: `SELECT seq, "offset", transaction_id::text, uuid, source, payload::text, metadata::text
FROM ` + held + ` WHERE relay = $1 AND topic = $2 ORDER BY seq LIMIT $3`,
		heldDelete: `DELETE FROM ` + held + ` WHERE relay = $1 AND seq = ANY($2::bigint[])`,
		// Rows read before they were due are copied from the outbox (by primary key) with their
		// topic ($4) and due time ($5); a row copied already (the batch is read again after a
		// failed position update) is not copied twice.
		delay: `INSERT INTO ` + delayed + ` (relay, topic, due_at, "offset", transaction_id, uuid, source, created_at, payload, metadata)
SELECT $1, k.topic, k.due, o."offset", o.transaction_id, o.uuid, o.source, o.created_at, o.payload, o.metadata
FROM unnest($2::bigint[], $3::text[], $4::text[], $5::timestamptz[]) WITH ORDINALITY AS k(off, xid, topic, due, n)
JOIN ` + table + ` o ON o.transaction_id = k.xid::xid8 AND o."offset" = k.off
ORDER BY k.n
ON CONFLICT (relay, transaction_id, "offset") DO NOTHING`,
		delayedDue: `SELECT min(due_at) FROM ` + delayed + ` WHERE relay = $1`,
		// $2 is the relay's clock: the same clock as the timer's, so a row is never read before
		// the time the timer waited for.
		delayedRead: `SELECT seq, "offset", transaction_id::text, uuid, source, payload::text, metadata::text
FROM ` + delayed + ` WHERE relay = $1 AND due_at <= $2 ORDER BY due_at, seq LIMIT $3`,
		delayedDelete: `DELETE FROM ` + delayed + ` WHERE relay = $1 AND seq = ANY($2::bigint[])`,
		// Due rows that join a held topic move to outbox_held in one statement, in due order.
		delayedHold: `WITH moved AS (DELETE FROM ` + delayed + ` WHERE relay = $1 AND seq = ANY($3::bigint[]) RETURNING *)
INSERT INTO ` + held + ` (relay, topic, "offset", transaction_id, uuid, source, created_at, payload, metadata)
SELECT $1, $2, "offset", transaction_id, uuid, source, created_at, payload, metadata FROM moved ORDER BY due_at, seq
ON CONFLICT (relay, transaction_id, "offset") DO NOTHING`,
		recordSystem: `UPDATE ` + offsets + ` SET system_identifier = $2::bigint WHERE consumer_group = $1`,
		paused:       `SELECT coalesce((SELECT paused_at IS NOT NULL FROM ` + offsets + ` WHERE consumer_group = $1), false)`,
	}
}
