package intent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/pgtx"
)

// recordTimeout bounds the statement that records an outcome once ctx has ended (see finish).
const recordTimeout = 5 * time.Second

// senderQueries are a Sender's statements on its intents table. Every change of a claimed row
// is fenced by its claim token ($2) and status SENDING, so a sender whose lease ran out cannot
// overwrite the outcome recorded by the sender that took over.
type senderQueries struct {
	claimPending, claimStuck       string
	sent, pending, park, unknown   string
	releaseInDoubt, releaseNotSent string
}

func newSenderQueries(schema string) senderQueries {
	t := pgtx.QualifiedName(schema, "intents")
	returning := ` RETURNING i.id, i.channel, i.intent_key, i.consumer, i.event_id, i.step, i.payload, i.status,
    i.attempts, coalesce(i.provider_id, ''), coalesce(i.last_error, ''), i.created_at, i.updated_at, i.sent_at,
    i.claim_token::text, coalesce(i.trace_parent, ''), coalesce(i.trace_state, '')`
	return senderQueries{
		claimPending: `WITH c AS (
    SELECT id FROM ` + t + ` WHERE status = 'PENDING' AND channel = ANY($1) AND run_after <= now()
    ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE ` + t + ` i SET status = 'SENDING', attempts = i.attempts + 1, claim_token = gen_random_uuid(),
    lease_until = now() + $2 * interval '1 microsecond', updated_at = now()
FROM c WHERE i.id = c.id` + returning,
		claimStuck: `WITH c AS (
    SELECT id FROM ` + t + ` WHERE status = 'SENDING' AND channel = ANY($1) AND lease_until < now()
    ORDER BY lease_until LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE ` + t + ` i SET attempts = i.attempts + 1, claim_token = gen_random_uuid(),
    lease_until = now() + $2 * interval '1 microsecond', updated_at = now()
FROM c WHERE i.id = c.id` + returning,
		sent: `UPDATE ` + t + ` SET status = 'SENT', provider_id = $3, sent_at = now(), claim_token = NULL,
    lease_until = NULL, updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		pending: `UPDATE ` + t + ` SET status = 'PENDING', run_after = now() + $3 * interval '1 microsecond',
    last_error = $4, claim_token = NULL, lease_until = NULL, updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		park: `UPDATE ` + t + ` SET status = $3, last_error = $4, claim_token = NULL, lease_until = NULL, updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		// Outcome unknown on a Reconcile channel: stay SENDING under a token nobody holds, so
		// that once the backoff has passed the row is recovered like a crash and looked up first.
		unknown: `UPDATE ` + t + ` SET lease_until = now() + $3 * interval '1 microsecond', last_error = $4,
    claim_token = gen_random_uuid(), updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		// Shutdown with the outcome in doubt (a send in flight, or an intent recovered from
		// SENDING and not settled yet): stay SENDING under a token nobody holds with the lease
		// already over, so that the next sender recovers it at once and applies the channel's
		// policy. The attempt is not counted: stopping was not the intent's doing.
		releaseInDoubt: `UPDATE ` + t + ` SET lease_until = now(), last_error = $3, claim_token = gen_random_uuid(),
    attempts = greatest(attempts - 1, 0), updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
		// Shutdown before the provider was called (or it answered NotSent): certainly not sent,
		// so simply PENDING again, due at once, the attempt not counted.
		releaseNotSent: `UPDATE ` + t + ` SET status = 'PENDING', run_after = now(), claim_token = NULL, lease_until = NULL,
    attempts = greatest(attempts - 1, 0), updated_at = now()
WHERE id = $1 AND claim_token = $2::uuid AND status = 'SENDING'`,
	}
}

// claim runs a claim statement. It is not cancelled with ctx: an intent claimed by a
// statement whose reply is lost would sit in SENDING until its lease ran out.
func (s *Sender) claim(ctx context.Context, query string) (*Intent, string, error) {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.config.SendTimeout)
	defer cancel()
	// Planned at each execution (replan.For): a plan cached while intents was empty reads
	// every retained intent (6.6 ms a claim at 50,000 SENT intents, against an index probe).
	row := s.db.QueryRowContext(qctx, query, s.replan.Args(s.channels, s.config.Lease.Microseconds())...)
	var in Intent
	var status, token string
	var sentAt sql.NullTime
	err := row.Scan(&in.ID, &in.Channel, &in.Key, &in.Consumer, &in.EventID, &in.Step, &in.Payload, &status,
		&in.Attempts, &in.ProviderID, &in.LastError, &in.CreatedAt, &in.UpdatedAt, &sentAt, &token, &in.TraceParent, &in.TraceState)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", nil
	}
	if err != nil {
		s.errs.Add(1)
		if pgtx.IsUndefinedTable(err) {
			return nil, "", fmt.Errorf("intent: the intents table is missing in schema %q: run the migrations: %w", s.config.Schema, err)
		}
		return nil, "", fmt.Errorf("intent: claim: %w", err)
	}
	in.Status = Status(status)
	return &in, token, nil
}

// finish runs one fenced state change. It survives the cancellation of ctx for recordTimeout,
// so that a sender being stopped still records an outcome it already has.
func (s *Sender) finish(ctx context.Context, query string, fields watermill.LogFields, args ...any) error {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	res, err := s.db.ExecContext(fctx, query, args...)
	if err != nil {
		s.errs.Add(1)
		return fmt.Errorf("intent: record outcome of intent %v: %w", args[0], err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		s.leaseLost.Add(1)
		s.logger.Error("Intent outcome not recorded: the lease ran out and another sender took the intent over", nil, fields)
	}
	return nil
}
