package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/failgroup"
	"github.com/wmonce/watermill-once/internal/inboxops"
	"github.com/wmonce/watermill-once/pgtx"
)

func (o *Ops) fingerprintExpr() string {
	return pgtx.QualifiedName(o.schema, "failure_fingerprint") + `('inbox', consumer, topic, last_error)`
}

// failureGroups returns the failure groups of the newest maxRows FAILED rows (0: of all), the
// largest first, and how many FAILED rows it left out (older than those). It only reads. Its
// cost is in the error patterns, computed once per distinct error text: on this project's test
// machine, under load, about a second per 10,000 rows whose errors all differ.
func (o *Ops) failureGroups(ctx context.Context, maxRows int) (groups []inboxops.FailureGroup, left int64, err error) {
	groups, left, err = failgroup.Read(ctx, o.db, o.schema, failgroup.Rows{
		Kind: "inbox",
		Select: `SELECT consumer AS who, topic, coalesce(last_error, '') AS reason, received_at AS at, id AS newest
    FROM ` + o.q.table + ` WHERE status = 'FAILED'`,
		NewestFirst: "newest DESC",
	}, maxRows, func(g *inboxops.FailureGroup) []any {
		return []any{&g.Fingerprint, &g.Consumer, &g.Topic, &g.Pattern, &g.Example, &g.Rows, &g.FirstSeen, &g.LastSeen}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("inbox: failure groups: %w", err)
	}
	return groups, left, nil
}

// replayGroup sends the FAILED rows of one failure group (narrowed by req.IDs) back to
// PENDING, due now, with their attempt count reset, as Replay does, in one statement, and wakes
// their processors. With req.DryRun it only lists them.
func (o *Ops) replayGroup(ctx context.Context, req inboxops.GroupRequest) (inboxops.GroupResult, error) {
	res, err := o.changeGroup(ctx, req, `status = 'PENDING', attempts = 0, next_attempt_at = now(), finished_at = NULL`)
	if err != nil {
		return inboxops.GroupResult{}, fmt.Errorf("inbox: replay group: %w", err)
	}
	if !req.DryRun {
		o.logger.Info("Inbox failure group replayed", watermill.LogFields{"fingerprint": req.Fingerprint, "rows": len(res.IDs)})
	}
	return res, nil
}

// skipGroup marks the FAILED rows of one failure group (narrowed by req.IDs) SKIPPED with
// reason, as Skip does: they will not run, their ordering keys move on, and they stay as
// dedupe records. With req.DryRun it only lists them (and needs no reason yet). (There is no
// discard for inbox rows: a deleted row would let a redelivered copy of its message run again.)
func (o *Ops) skipGroup(ctx context.Context, req inboxops.GroupRequest, reason string) (inboxops.GroupResult, error) {
	if strings.TrimSpace(reason) == "" && !req.DryRun {
		return inboxops.GroupResult{}, errors.New("inbox: skip group: give a reason; it is kept in last_error")
	}
	res, err := o.changeGroup(ctx, req, `status = 'SKIPPED', finished_at = now(), last_error = $1::text || coalesce('; last error: ' || last_error, '')`, "skipped: "+reason)
	if err != nil {
		return inboxops.GroupResult{}, fmt.Errorf("inbox: skip group: %w", err)
	}
	if !req.DryRun {
		o.logger.Info("Inbox failure group skipped", watermill.LogFields{"fingerprint": req.Fingerprint, "rows": len(res.IDs), "reason": reason})
	}
	return res, nil
}

// changeGroup runs one UPDATE of the group's FAILED rows (or lists them for a dry run),
// returning their ids, and wakes the processors of the consumers it changed. set's parameters
// are setArgs, $1 on.
func (o *Ops) changeGroup(ctx context.Context, req inboxops.GroupRequest, set string, setArgs ...any) (inboxops.GroupResult, error) {
	if err := failgroup.CheckFingerprint(req.Fingerprint); err != nil {
		return inboxops.GroupResult{}, err
	}
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if !req.DryRun {
		for _, v := range setArgs {
			arg(v)
		}
	}
	where := `status = 'FAILED' AND ` + o.fingerprintExpr() + ` = ` + arg(req.Fingerprint)
	if len(req.IDs) > 0 {
		where += ` AND id = ANY(` + arg(req.IDs) + `::bigint[])`
	}
	if req.DryRun {
		return o.groupIDs(ctx, where, args)
	}
	var ids string
	ch := arg(o.q.channel)
	query := `WITH c AS (
    UPDATE ` + o.q.table + ` SET ` + set + `, claim_token = NULL, lease_until = NULL
    WHERE ` + where + `
    RETURNING id, consumer
)
SELECT coalesce((SELECT json_agg(id ORDER BY id) FROM c), '[]')::text,
    (SELECT count(pg_notify(` + ch + `::text, consumer)) FROM (SELECT DISTINCT consumer FROM c) d)`
	var notified int
	if err := o.db.QueryRowContext(ctx, query, args...).Scan(&ids, &notified); err != nil {
		return inboxops.GroupResult{}, err
	}
	return decodeIDs(ids)
}

// groupIDs lists the ids of the rows where selects: a dry run of changeGroup.
func (o *Ops) groupIDs(ctx context.Context, where string, args []any) (inboxops.GroupResult, error) {
	var ids string
	err := o.db.QueryRowContext(ctx, `SELECT coalesce(json_agg(id ORDER BY id), '[]')::text FROM `+o.q.table+` WHERE `+where, args...).Scan(&ids)
	if err != nil {
		return inboxops.GroupResult{}, err
	}
	return decodeIDs(ids)
}

func decodeIDs(s string) (inboxops.GroupResult, error) {
	res := inboxops.GroupResult{IDs: []int64{}}
	if err := json.Unmarshal([]byte(s), &res.IDs); err != nil {
		return inboxops.GroupResult{}, fmt.Errorf("row ids: %w", err)
	}
	return res, nil
}
