// Package admintest is the admin handler's test fixture: a schema the real components filled
// (claims, outbox rows forwarded and rejected, inbox rows parked and done), shared by ops/admin's
// tests and e2e/adminbrowser's browser tests.
package admintest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/relaytest"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Fixture is a schema filled by the real components:
//   - consumer "rewards" (effectively-once middleware, kept for its in-process counts) applied
//     m-1, m-2, m-3 and saw m-1 again: 3 fresh, 1 duplicate; each emitted one outbox row;
//   - relay "sms" forwarded two of the three outbox rows (backlog 1), and set aside in
//     outbox_rejected a row another program wrote into the outbox (uuid "legacy-7", not a
//     forwarder envelope) between them;
//   - inbox consumer "billing" received failed inv-1..inv-<failed> and one good message, and a
//     Processor whose handler declines every message marked fail=1 (MaxAttempts 1) parked
//     the failing ones as FAILED and finished the good one (DONE). The processor is stopped.
type Fixture struct {
	DB     *sql.DB
	Schema string
	MW     *once.Middleware
	Handle message.HandlerFunc // rewards' handler behind the middleware
}

// RejectedPayload is the payload of the outbox row the relay rejects.
const RejectedPayload = `{"order":42,"lines":[{"sku":"A-1","qty":2}],"note":"<script>alert(1)</script>"}`

// Deliver hands rewards' handler a message with id.
func (f *Fixture) Deliver(t *testing.T, id string) {
	t.Helper()
	_, err := f.Handle(message.NewMessage(id, []byte(`{"amount":5}`)))
	require.NoError(t, err)
}

// Table returns name qualified by the fixture's schema.
func (f *Fixture) Table(name string) string { return pgtx.QualifiedName(f.Schema, name) }

// New fills a fresh schema (see Fixture) with failed parked inbox rows.
func New(t *testing.T, failed int) *Fixture {
	t.Helper()
	db := pgtest.DB(t)
	f := &Fixture{DB: db, Schema: pgtest.Schema(t, db)}
	ctx := context.Background()

	mw, err := once.New(db, once.Config{Schema: f.Schema, Consumer: "rewards", OutputTopic: "cashback"}, nil)
	require.NoError(t, err)
	f.MW = mw
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{}`))}, nil
	})
	f.Handle = h
	for _, id := range []string{"m-1", "m-2", "m-1"} {
		f.Deliver(t, id)
	}
	// A row written by another program: the relay cannot decode it and sets it aside.
	pgtest.Exec(t, db, `INSERT INTO `+f.Table("outbox")+` (uuid, payload, metadata, transaction_id) VALUES ('legacy-7', $1, '{"source":"legacy-billing","attempt":"3"}', pg_current_xact_id())`, RejectedPayload)
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: f.Schema, Name: "sms"}, nil)
	require.NoError(t, err)
	RelayUntil(t, relay, "forward 2 rows and reject 1", func(st outbox.RelayCounters) bool { return st.Forwarded >= 2 && st.Rejected >= 1 })
	_, err = h(message.NewMessage("m-3", []byte(`{"amount":7}`)))
	require.NoError(t, err)

	recv, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Schema: f.Schema, Consumer: "billing"}, nil)
	require.NoError(t, err)
	defer recv.Close()
	for i := 1; i <= failed+1; i++ {
		msg := message.NewMessage(fmt.Sprintf("inv-%d", i), []byte(fmt.Sprintf(`{"invoice":%d,"note":"<img src=x onerror=alert(1)>"}`, i)))
		if i <= failed {
			msg.Metadata.Set("fail", "1")
		}
		require.NoError(t, recv.Handle(msg))
	}
	handler, handled := SignalHandled(func(msg *message.Message) ([]*message.Message, error) {
		if msg.Metadata.Get("fail") == "1" {
			return nil, errors.New("card declined: <b>insufficient funds</b>")
		}
		return nil, nil
	})
	proc, err := inbox.NewProcessor(db, handler, inbox.ProcessorConfig{Schema: f.Schema, Consumer: "billing", Workers: 1, MaxAttempts: 1,
		PollInterval: 20 * time.Millisecond, ShutdownGrace: testsignal.Timeout}, nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- proc.Run(ctx) }()
	WaitHandled(t, handled, failed+1)
	// Close lets the attempts under way record their outcome (within ShutdownGrace).
	require.NoError(t, proc.Close())
	require.NoError(t, <-done)
	require.Equal(t, failed, f.Count(t, "FAILED"))
	require.Equal(t, 1, f.Count(t, "DONE"))
	return f
}

// SignalHandled wraps an inbox handler: the returned channel receives the UUID of each message
// it handled, once it returned.
func SignalHandled(h message.HandlerFunc) (message.HandlerFunc, <-chan string) {
	handled := make(chan string, 100)
	return func(msg *message.Message) ([]*message.Message, error) {
		defer func() { handled <- msg.UUID }()
		return h(msg)
	}, handled
}

// WaitHandled waits until n different messages were handled.
func WaitHandled(t *testing.T, handled <-chan string, n int) {
	t.Helper()
	seen := map[string]bool{}
	for len(seen) < n {
		seen[testwait.Receive(t, handled, fmt.Sprintf("%d of %d messages handled", len(seen)+1, n))] = true
	}
}

// RelayUntil runs relay rounds until done holds (relaytest.RunUntil; two idle rounds: the first
// may only close the previous round).
func RelayUntil(t *testing.T, relay *outbox.Relay, what string, done func(outbox.RelayCounters) bool) {
	t.Helper()
	relaytest.RunUntil(t, relay, what, 2, done)
}

// Count returns how many of billing's inbox rows have status.
func (f *Fixture) Count(t *testing.T, status string) int {
	return pgtest.Count(t, f.DB, `SELECT Count(*) FROM `+f.Table("inbox")+` WHERE consumer = 'billing' AND status = $1`, status)
}

// RowStatus returns the status of inbox row id.
func (f *Fixture) RowStatus(t *testing.T, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, f.DB.QueryRowContext(t.Context(), `SELECT status FROM `+f.Table("inbox")+` WHERE id = $1`, id).Scan(&s))
	return s
}

// IDs returns the ids of billing's inbox rows with status, in order.
func (f *Fixture) IDs(t *testing.T, status string) []int64 {
	t.Helper()
	rows, err := f.DB.QueryContext(t.Context(), `SELECT id FROM `+f.Table("inbox")+` WHERE consumer = 'billing' AND status = $1 ORDER BY id`, status)
	require.NoError(t, err)
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		out = append(out, id)
	}
	require.NoError(t, rows.Err())
	return out
}

// Server starts the handler on a real listener.
func (f *Fixture) Server(t *testing.T, cfg admin.Config) *httptest.Server {
	t.Helper()
	srv, _ := f.Serve(t, cfg)
	return srv
}

// Serve is Server that also returns the handler (to take samples).
func (f *Fixture) Serve(t *testing.T, cfg admin.Config) (*httptest.Server, *admin.Handler) {
	t.Helper()
	cfg.Schema = f.Schema
	h, err := admin.NewHandler(f.DB, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.Close()) })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, h
}

// RelayAll has relay sms forward the row the Fixture left waiting, so its backlog is 0.
func (f *Fixture) RelayAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(f.DB, pub, outbox.RelayConfig{Schema: f.Schema, Name: "sms"}, nil)
	require.NoError(t, err)
	RelayUntil(t, relay, "forward the row left waiting", func(c outbox.RelayCounters) bool { return c.Forwarded >= 1 })
	relays, _, err := outbox.Stats(ctx, f.DB, f.Schema)
	require.NoError(t, err)
	require.Len(t, relays, 1)
	require.Zero(t, relays[0].Backlog)
}

// RefusingPublisher refuses for good (as a broker refuses a record too large) every call
// holding a message of refuse, until refuse is cleared.
type RefusingPublisher struct{ Refuse map[string]bool }

func (p *RefusingPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if p.Refuse[m.UUID] {
			return wmonce.Permanent(errors.New("kafka server: Message was too large, server rejected it"))
		}
	}
	return nil
}
func (p *RefusingPublisher) Close() error { return nil }

// KafkaRejects has relay "kafka" set aside the row of message id: the broker refuses it.
func (f *Fixture) KafkaRejects(t *testing.T, id string) (*outbox.Relay, *RefusingPublisher) {
	t.Helper()
	pub := &RefusingPublisher{Refuse: map[string]bool{}}
	relay, err := outbox.NewRelay(f.DB, pub, outbox.RelayConfig{Schema: f.Schema, Name: "kafka"}, nil)
	require.NoError(t, err)
	var uuid string
	require.NoError(t, f.DB.QueryRowContext(t.Context(), `SELECT uuid FROM `+f.Table("outbox")+` WHERE metadata->>'causation_id' = $1`, id).Scan(&uuid))
	pub.Refuse[uuid] = true
	// A new relay reads the outbox from its start: it also rejects the Fixture's undecodable row.
	RelayUntil(t, relay, "reject the row of "+id, func(st outbox.RelayCounters) bool { return st.Rejected >= 2 })
	return relay, pub
}

// FailureGroup returns the group of kind at owner (consumer, handler or relay) and topic.
func FailureGroup(t *testing.T, groups []operate.FailureGroup, kind, owner, topic string) operate.FailureGroup {
	t.Helper()
	for _, g := range groups {
		if g.Kind == kind && g.Consumer+g.Handler+g.Relay == owner && g.Topic == topic {
			return g
		}
	}
	t.Fatalf("no %s failure group of %q on topic %q in %+v", kind, owner, topic, groups)
	return operate.FailureGroup{}
}
