package once

import (
	"fmt"

	"github.com/wmonce/watermill-once/internal/partition"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// claimQueries are the statements on the claims table: processed_messages, or
// processed_messages_daily with PartitionByDay (whose statements take the day as last argument).
type claimQueries struct {
	daily            bool
	claim, lookup    string // one key
	claimMany        string // many keys: unnest arrays, RETURNING the fresh ones
	lookupMany       string
	savepointClaim   string // the subscriber-transaction path: savepoint, guard and claim at once
	savepointRelease string
	doom             string
}

// With wireGuard the own-transaction claim does not open the server's attempt guard: the
// connection guards the transaction (txguard.For) and the server does no work for it.
func newClaimQueries(schema string, daily, wireGuard bool) claimQueries {
	t := pgtx.QualifiedName(schema, "processed_messages")
	cols, arrays, dayCond := "consumer, message_id, payload_sha256", "$1::text[], $2::text[], $3::bytea[]", ""
	typed := "$1::text, $2::text, $3::bytea"
	if daily {
		t = pgtx.QualifiedName(schema, partition.Parent)
		cols, arrays, dayCond = cols+", occurred_on", arrays+", $4::date[]", " AND occurred_on = $3"
		typed += ", $4::date"
	}
	// The own-transaction claim opens the server's attempt guard as it goes (internal/txguard).
	claim := `INSERT INTO ` + t + ` (` + cols + `) SELECT ` + typed + ` WHERE ` + txguard.Condition(schema) + ` ON CONFLICT DO NOTHING`
	if wireGuard {
		claim = `INSERT INTO ` + t + ` (` + cols + `) VALUES (` + typed + `) ON CONFLICT DO NOTHING`
	}
	return claimQueries{
		daily:  daily,
		claim:  claim,
		lookup: `SELECT payload_sha256, processed_at FROM ` + t + ` WHERE consumer = $1 AND message_id = $2` + dayCond,
		claimMany: `INSERT INTO ` + t + ` (` + cols + `)
SELECT * FROM unnest(` + arrays + `)
ON CONFLICT DO NOTHING RETURNING consumer, message_id`,
		lookupMany: `SELECT p.consumer, p.message_id, p.payload_sha256, p.processed_at
FROM unnest($1::text[], $2::text[]) AS k(consumer, message_id)
JOIN ` + t + ` p USING (consumer, message_id)`,
		savepointClaim: pgtx.WireGuardOpen + spBegin + `;
INSERT INTO ` + t + ` (` + cols + `) SELECT ` + typed + ` WHERE ` + txguard.Condition(schema) + ` ON CONFLICT DO NOTHING`,
		savepointRelease: fmt.Sprintf(spRelease, pgtx.QualifiedName(schema, "attempt_close")),
		doom:             fmt.Sprintf(spDoom, pgtx.QualifiedName(schema, "attempt_doom")),
	}
}

// Savepoint statements for the subscriber-transaction path. Each is sent in one round trip at
// most: pgx sends a statement list without arguments with the simple protocol. The attempt opens
// with spBegin and the claim in one list (claimQueries.savepointClaim), whose arguments pgx
// quotes itself (QueryExecModeSimpleProtocol; never string concatenation). The claim is
// conditional on attempt_begin() (migration 010), which marks the attempt open in a
// transaction-local setting, inserts the transaction's one guard row on its first attempt, and
// refuses (SQLSTATE WM001) in a doomed transaction. The setting is reverted with the savepoint
// when an attempt is rolled back, and the guard row's deferred trigger refuses a COMMIT while it
// says open or doomed. When the subscriber's pool is from pgtx.Open, its connection guards the
// attempt on the wire as well (pgtx.WireGuardOpen leads the claim, pgtx.WireGuardClose every
// statement that ends the attempt; elsewhere they are comments): a COMMIT or ROLLBACK the
// handler sends as SQL text is refused there, and nothing after it reaches the server.
// spRelease and spRollback are pgtx.DeferredPrefix statements: on a pool
// from pgtx.Open they travel with the transaction's next statement (the next message's claim,
// or the subscriber's offset update and COMMIT), which therefore cannot run without them, so
// they cost no round trip of their own.
const (
	spBegin    = `SAVEPOINT wmonce_attempt`
	spRelease  = pgtx.DeferredPrefix + pgtx.WireGuardClose + `CALL %s(); RELEASE SAVEPOINT wmonce_attempt`
	spRollback = pgtx.DeferredPrefix + pgtx.WireGuardClose + `ROLLBACK TO SAVEPOINT wmonce_attempt; RELEASE SAVEPOINT wmonce_attempt`
	// spDoom undoes the attempt and marks the transaction doomed: its COMMIT fails (the guard
	// row's deferred trigger) and every later attempt_begin() in it refuses with WM001.
	spDoom = pgtx.WireGuardClose + `ROLLBACK TO SAVEPOINT wmonce_attempt; RELEASE SAVEPOINT wmonce_attempt; SELECT %s()`
	// codeAttemptRefused is attempt_begin()'s refusal in a doomed transaction.
	codeAttemptRefused = "WM001"
)
