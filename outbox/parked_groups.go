package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmonce/watermill-once/internal/failgroup"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/pgtx"
)

// Parked messages are the outbox rows ParkingPublisher stored for Watermill's poison queue:
// a copy of each message a consumer refused, with the poison queue's metadata (the reason, the
// topic it was consumed from, the handler), forwarded to the poison topic. ParkedGroups groups
// them by the schema's fingerprint rule (migration 015) over the handler, the consumed topic
// and the reason; ReplayParkedGroup stores the original messages again for the topic they were
// consumed from, and DiscardParkedGroup sets a group aside. Both record what they settled in
// outbox_parked_settled, so a parked copy is replayed at most once and leaves the groups.
// Parked rows are found as long as outbox retention keeps them.

// The poison queue's metadata keys (Watermill's middleware.PoisonQueue), removed from a
// replayed message so that it is the message the consumer was given.
var poisonKeys = []string{middleware.ReasonForPoisonedKey, middleware.PoisonedTopicKey, middleware.PoisonedHandlerKey, middleware.PoisonedSubscriberKey}

func parkedWhere(schema string) string {
	return `(o.metadata->>'reason_poisoned') IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM ` + pgtx.QualifiedName(schema, "outbox_parked_settled") + ` s WHERE s."offset" = o."offset")`
}

func parkedFingerprintExpr(schema string) string {
	return pgtx.QualifiedName(schema, "failure_fingerprint") +
		`('parked', coalesce(o.metadata->>'handler_poisoned', ''), coalesce(o.metadata->>'topic_poisoned', ''), o.metadata->>'reason_poisoned')`
}

// parkedGroups returns the groups of the newest maxRows parked messages not replayed or
// discarded yet (0: of all), the largest first, and how many it left out (older than those).
// It only reads (through the partial index of parked rows); the reason patterns are computed
// once per distinct reason.
func parkedGroups(ctx context.Context, db *sql.DB, schema string, maxRows int) (groups []outboxops.ParkedGroup, left int64, err error) {
	if err := checkSchema("parked groups", db, &schema); err != nil {
		return nil, 0, err
	}
	groups, left, err = failgroup.Read(ctx, db, schema, parkedFailures(schema), maxRows, func(g *outboxops.ParkedGroup) []any {
		return []any{&g.Fingerprint, &g.Handler, &g.Topic, &g.Pattern, &g.Example, &g.Rows, &g.FirstSeen, &g.LastSeen}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: parked groups: %w", err)
	}
	return groups, left, nil
}

// parkedFailures are the parked copies not settled yet, as failure groups read them.
func parkedFailures(schema string) failgroup.Rows {
	return failgroup.Rows{
		Kind: "parked",
		Select: `SELECT coalesce(o.metadata->>'handler_poisoned', '') AS who, coalesce(o.metadata->>'topic_poisoned', '') AS topic,
        o.metadata->>'reason_poisoned' AS reason, o.created_at::timestamptz AS at, o."offset" AS newest
    FROM ` + pgtx.QualifiedName(schema, "outbox") + ` o WHERE ` + parkedWhere(schema),
		NewestFirst: "newest DESC",
	}
}

// parkedRow is one parked copy as a replay reads it.
type parkedRow struct {
	offset   int64
	payload  sql.NullString
	source   string
	consumed string // topic_poisoned
}

func scanParkedRow(s pgtx.Scanner) (parkedRow, error) {
	var r parkedRow
	err := s.Scan(&r.offset, &r.payload, &r.source, &r.consumed)
	return r, err
}

// parkedRows reads the group's parked copies not settled yet (narrowed by req.Offsets).
func parkedRows(ctx context.Context, q pgtx.Executor, schema string, req outboxops.ParkedGroupRequest) ([]parkedRow, error) {
	return pgtx.QueryAll(ctx, q, scanParkedRow, `SELECT o."offset", o.payload::text, o.source, coalesce(o.metadata->>'topic_poisoned', '')
FROM `+pgtx.QualifiedName(schema, "outbox")+` o
WHERE `+parkedWhere(schema)+` AND `+parkedFingerprintExpr(schema)+` = $1 AND (cardinality($2::bigint[]) = 0 OR o."offset" = ANY($2::bigint[]))
ORDER BY o."offset"`, req.Fingerprint, nonNil(req.Offsets))
}

// original returns the message the parked copy was made from, without the poison queue's
// metadata, to store again for the topic it was consumed from; false when it cannot be
// replayed: no topic it was consumed from, not decodable, or a UUID or metadata the outbox
// cannot store (a message parked for exactly that).
func (r parkedRow) original() (*message.Message, bool) {
	_, parked, err := unmarshalEnvelope([]byte(r.payload.String)) // its topic is the poison topic
	if !r.payload.Valid || err != nil || r.consumed == "" {
		return nil, false
	}
	original, err := RecoverParked(parked)
	if err != nil || checkMessage(original) != nil {
		return nil, false
	}
	for _, k := range poisonKeys {
		delete(original.Metadata, k)
	}
	return original, true
}

// replayParkedGroup stores the original of each parked copy of one group (narrowed by
// req.Offsets) in the outbox again, for the topic it was consumed from: its UUID, payload and
// metadata as the consumer received them (RecoverParked), without the poison queue's keys, as
// a new row of the copy's source, forwarded after every row committed before it. The copies
// are recorded as replayed, in the same transaction, and leave the group. Fix what made the
// consumer refuse them first: a message refused again is parked again, in a new group entry.
// Consumers deduplicate by key as always, so a message that was in fact applied (a parked copy
// of a duplicate) is skipped. With req.DryRun it lists the copies and changes nothing.
func replayParkedGroup(ctx context.Context, db *sql.DB, schema string, req outboxops.ParkedGroupRequest) (outboxops.ParkedGroupResult, error) {
	return actOnParkedGroup(ctx, db, schema, req, "replay", func(ctx context.Context, tx *sql.Tx, schema string, rows []parkedRow, res *outboxops.ParkedGroupResult) error {
		writers := map[string]*Writer{}
		for _, r := range rows {
			original, ok := r.original()
			if !ok {
				res.Unreplayable = append(res.Unreplayable, r.offset)
				continue
			}
			res.Offsets = append(res.Offsets, r.offset)
			if req.DryRun {
				continue
			}
			w := writers[r.source]
			if w == nil {
				var err error
				if w, err = NewWriter(Config{Schema: schema, Source: r.source}); err != nil {
					return err
				}
				writers[r.source] = w
			}
			if err := w.store(ctx, tx, r.consumed, []*message.Message{original}, false, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// discardParkedGroup records the parked copies of one group (narrowed by req.Offsets) as
// discarded: they leave the group and are never replayed. The copies themselves stay where
// they are (in the outbox until retention, and in the poison topic). With req.DryRun it lists
// them and changes nothing.
func discardParkedGroup(ctx context.Context, db *sql.DB, schema string, req outboxops.ParkedGroupRequest) (outboxops.ParkedGroupResult, error) {
	return actOnParkedGroup(ctx, db, schema, req, "discard", func(_ context.Context, _ *sql.Tx, _ string, rows []parkedRow, res *outboxops.ParkedGroupResult) error {
		for _, r := range rows {
			res.Offsets = append(res.Offsets, r.offset)
		}
		return nil
	})
}

// actOnParkedGroup checks req and schema (defaulted), reads the group's parked copies in a
// transaction, lets take choose the copies the action applies to (into res.Offsets; with
// req.DryRun it must change nothing) and, unless it is a dry run, records them settled by
// action in that transaction.
func actOnParkedGroup(ctx context.Context, db *sql.DB, schema string, req outboxops.ParkedGroupRequest, action string,
	take func(ctx context.Context, tx *sql.Tx, schema string, rows []parkedRow, res *outboxops.ParkedGroupResult) error,
) (outboxops.ParkedGroupResult, error) {
	what := action + " parked group"
	if err := checkSchema(what, db, &schema); err != nil {
		return outboxops.ParkedGroupResult{}, err
	}
	if err := failgroup.CheckFingerprint(req.Fingerprint); err != nil {
		return outboxops.ParkedGroupResult{}, fmt.Errorf("outbox: %s: %w", what, err)
	}
	var res outboxops.ParkedGroupResult
	err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		res = outboxops.ParkedGroupResult{Offsets: []int64{}}
		rows, err := parkedRows(ctx, tx, schema, req)
		if err != nil {
			return err
		}
		if err := take(ctx, tx, schema, rows, &res); err != nil {
			return err
		}
		if req.DryRun || len(res.Offsets) == 0 {
			return nil
		}
		return settleParked(ctx, tx, schema, res.Offsets, action)
	})
	if err != nil {
		return outboxops.ParkedGroupResult{}, fmt.Errorf("outbox: %s: %w", what, err)
	}
	return res, nil
}

// settleParked records offsets as settled by action, and forgets the settled copies outbox
// retention has deleted since (through the partial index of parked rows), so the record stays
// as small as the parked rows still in the outbox. A copy another operator settled meanwhile
// makes the whole operation fail rather than replay it twice.
func settleParked(ctx context.Context, tx *sql.Tx, schema string, offsets []int64, action string) error {
	settled := pgtx.QualifiedName(schema, "outbox_parked_settled")
	if _, err := tx.ExecContext(ctx, `DELETE FROM `+settled+` s WHERE NOT EXISTS (SELECT 1 FROM `+pgtx.QualifiedName(schema, "outbox")+` o
WHERE o."offset" = s."offset" AND (o.metadata->>'reason_poisoned') IS NOT NULL)`); err != nil {
		return err
	}
	var n int
	err := tx.QueryRowContext(ctx, `WITH ins AS (
    INSERT INTO `+settled+` ("offset", action)
    SELECT unnest($1::bigint[]), $2 ON CONFLICT ("offset") DO NOTHING RETURNING 1
) SELECT count(*) FROM ins`, offsets, action).Scan(&n)
	if err != nil {
		return err
	}
	if n != len(offsets) {
		b, _ := json.Marshal(offsets)
		return fmt.Errorf("%w: parked copies %s: list the groups again", outboxops.ErrParkedSettled, b)
	}
	return nil
}
