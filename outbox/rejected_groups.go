package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/wmonce/watermill-once/internal/failgroup"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/pgtx"
)

func rejectedFingerprintExpr(schema string) string {
	return pgtx.QualifiedName(schema, "failure_fingerprint") + `('rejected', relay, coalesce(topic, ''), error)`
}

// rejectedGroups returns the groups of the newest maxRows rows of outbox_rejected (0: of all),
// the largest first, and how many rows it left out (older than those). It only reads; the
// error patterns are computed once per distinct error text.
func rejectedGroups(ctx context.Context, db *sql.DB, schema string, maxRows int) (groups []outboxops.RejectedGroup, left int64, err error) {
	if err := checkSchema("rejected groups", db, &schema); err != nil {
		return nil, 0, err
	}
	// newest is the time of rejection, as the example was always the newest rejection's error;
	// the offset breaks ties for the limit.
	groups, left, err = failgroup.Read(ctx, db, schema, failgroup.Rows{
		Kind: "rejected",
		Select: `SELECT relay AS who, coalesce(topic, '') AS topic, error AS reason, rejected_at AS at, rejected_at AS newest, "offset"
    FROM ` + pgtx.QualifiedName(schema, "outbox_rejected"),
		NewestFirst: `newest DESC, "offset" DESC`,
	}, maxRows, func(g *outboxops.RejectedGroup) []any {
		return []any{&g.Fingerprint, &g.Relay, &g.Topic, &g.Pattern, &g.Example, &g.Rows, &g.FirstSeen, &g.LastSeen}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: rejected groups: %w", err)
	}
	return groups, left, nil
}

// groupRows lists the relay and offsets of a rejected group's rows (narrowed by req.Offsets).
func groupRows(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, schema string, req outboxops.RejectedGroupRequest) (outboxops.RejectedGroupResult, error) {
	var relays, offsets string
	err := q.QueryRowContext(ctx, `SELECT coalesce(json_agg(DISTINCT relay), '[]')::text, coalesce(json_agg("offset" ORDER BY "offset"), '[]')::text
FROM `+pgtx.QualifiedName(schema, "outbox_rejected")+` WHERE `+rejectedFingerprintExpr(schema)+` = $1 AND (cardinality($2::bigint[]) = 0 OR "offset" = ANY($2::bigint[]))`,
		req.Fingerprint, nonNil(req.Offsets)).Scan(&relays, &offsets)
	if err != nil {
		return outboxops.RejectedGroupResult{}, err
	}
	var names []string
	res := outboxops.RejectedGroupResult{Offsets: []int64{}}
	if err := errors.Join(json.Unmarshal([]byte(relays), &names), json.Unmarshal([]byte(offsets), &res.Offsets)); err != nil {
		return outboxops.RejectedGroupResult{}, err
	}
	if len(names) > 1 { // a fingerprint collision across relays: 64 bits make it all but impossible
		return outboxops.RejectedGroupResult{}, fmt.Errorf("fingerprint %s matches rows of relays %v: narrow it with offsets", req.Fingerprint, names)
	}
	if len(names) == 1 {
		res.Relay = names[0]
	}
	return res, nil
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

// republishRejectedGroup stores the rows of one rejected group (narrowed by req.Offsets) in
// the outbox again and removes them from outbox_rejected, as RepublishRejected does (same
// guarantee, same order rule), and returns the offsets its transaction moved (none for rows a
// concurrent call took first). With req.DryRun it lists them and changes nothing.
func republishRejectedGroup(ctx context.Context, db *sql.DB, schema string, req outboxops.RejectedGroupRequest) (outboxops.RejectedGroupResult, error) {
	if err := checkSchema("republish rejected group", db, &schema); err != nil {
		return outboxops.RejectedGroupResult{}, err
	}
	if err := failgroup.CheckFingerprint(req.Fingerprint); err != nil {
		return outboxops.RejectedGroupResult{}, fmt.Errorf("outbox: republish rejected group: %w", err)
	}
	res, err := groupRows(ctx, db, schema, req)
	if err != nil {
		return outboxops.RejectedGroupResult{}, fmt.Errorf("outbox: republish rejected group: %w", err)
	}
	if len(res.Offsets) == 0 {
		return res, nil
	}
	r, err := republishRejected(ctx, db, schema, outboxops.RepublishRequest{Relay: res.Relay, Offsets: res.Offsets, DryRun: req.DryRun})
	if err != nil {
		return outboxops.RejectedGroupResult{}, err
	}
	// What RepublishRejected's transaction moved, not what was read before it: a concurrent
	// call may have republished some or all of the rows meanwhile.
	res.Offsets, res.Undecodable = r.Offsets, r.Undecodable
	return res, nil
}

// discardRejectedGroup deletes the rows of one rejected group (narrowed by req.Offsets) from
// outbox_rejected, in one statement, and returns those that statement deleted (none for rows
// a concurrent call took first). A rejected row is the only copy of a
// message the relay could not forward: a discarded one is gone. With req.DryRun it lists them
// and deletes nothing.
func discardRejectedGroup(ctx context.Context, db *sql.DB, schema string, req outboxops.RejectedGroupRequest) (outboxops.RejectedGroupResult, error) {
	if err := checkSchema("discard rejected group", db, &schema); err != nil {
		return outboxops.RejectedGroupResult{}, err
	}
	if err := failgroup.CheckFingerprint(req.Fingerprint); err != nil {
		return outboxops.RejectedGroupResult{}, fmt.Errorf("outbox: discard rejected group: %w", err)
	}
	var res outboxops.RejectedGroupResult
	err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		if res, err = groupRows(ctx, tx, schema, req); err != nil || len(res.Offsets) == 0 || req.DryRun {
			return err
		}
		// The rows the DELETE removed, not those read above: a concurrent discard or republish
		// may have taken some of them meanwhile.
		res.Offsets, err = pgtx.QueryAll(ctx, tx, scanOffset, `DELETE FROM `+pgtx.QualifiedName(schema, "outbox_rejected")+` WHERE relay = $1 AND "offset" = ANY($2::bigint[]) AND `+rejectedFingerprintExpr(schema)+` = $3
RETURNING "offset"`, res.Relay, res.Offsets, req.Fingerprint)
		slices.Sort(res.Offsets)
		return err
	})
	if err != nil {
		return outboxops.RejectedGroupResult{}, fmt.Errorf("outbox: discard rejected group: %w", err)
	}
	return res, nil
}
