// Package adminbrowser_test drives ops/admin's page in headless Chromium (chromedp) against
// rows the real components made: black-box tests of the admin handler, in the e2e module so
// that the library's go.mod does not require chromedp. fixture_test.go and helpers_test.go are
// copies of ops/admin's own test fixture and helpers (a test file of another module cannot
// import them); keep them in step when the fixture changes.
package adminbrowser_test

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

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/relaytest"
	"github.com/wmonce/watermill-once/internal/testsignal"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// fixture is a schema filled by the real components:
//   - consumer "rewards" (effectively-once middleware, kept for its in-process counts) applied
//     m-1, m-2, m-3 and saw m-1 again: 3 fresh, 1 duplicate; each emitted one outbox row;
//   - relay "sms" forwarded two of the three outbox rows (backlog 1), and set aside in
//     outbox_rejected a row another program wrote into the outbox (uuid "legacy-7", not a
//     forwarder envelope) between them;
//   - inbox consumer "billing" received failed inv-1..inv-<failed> and one good message, and a
//     Processor whose handler declines every message marked fail=1 (MaxAttempts 1) parked
//     the failing ones as FAILED and finished the good one (DONE). The processor is stopped.
type fixture struct {
	db     *sql.DB
	schema string
	mw     *once.Middleware
	handle message.HandlerFunc // rewards' handler behind the middleware
}

// rejectedPayload is the payload of the outbox row the relay rejects.
const rejectedPayload = `{"order":42,"lines":[{"sku":"A-1","qty":2}],"note":"<script>alert(1)</script>"}`

// deliver hands rewards' handler a message with id.
func (f *fixture) deliver(t *testing.T, id string) {
	t.Helper()
	_, err := f.handle(message.NewMessage(id, []byte(`{"amount":5}`)))
	require.NoError(t, err)
}

func (f *fixture) table(name string) string { return pgtx.QualifiedName(f.schema, name) }

func newFixture(t *testing.T, failed int) *fixture {
	t.Helper()
	db := pgtest.DB(t)
	f := &fixture{db: db, schema: pgtest.Schema(t, db)}
	ctx := context.Background()

	mw, err := once.New(db, once.Config{Schema: f.schema, Consumer: "rewards", OutputTopic: "cashback"}, nil)
	require.NoError(t, err)
	f.mw = mw
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{}`))}, nil
	})
	f.handle = h
	for _, id := range []string{"m-1", "m-2", "m-1"} {
		f.deliver(t, id)
	}
	// A row written by another program: the relay cannot decode it and sets it aside.
	pgtest.Exec(t, db, `INSERT INTO `+f.table("outbox")+` (uuid, payload, metadata, transaction_id) VALUES ('legacy-7', $1, '{"source":"legacy-billing","attempt":"3"}', pg_current_xact_id())`, rejectedPayload)
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: f.schema, Name: "sms"}, nil)
	require.NoError(t, err)
	relayUntil(t, relay, "forward 2 rows and reject 1", func(st outbox.RelayCounters) bool { return st.Forwarded >= 2 && st.Rejected >= 1 })
	_, err = h(message.NewMessage("m-3", []byte(`{"amount":7}`)))
	require.NoError(t, err)

	recv, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Schema: f.schema, Consumer: "billing"}, nil)
	require.NoError(t, err)
	defer recv.Close()
	for i := 1; i <= failed+1; i++ {
		msg := message.NewMessage(fmt.Sprintf("inv-%d", i), []byte(fmt.Sprintf(`{"invoice":%d,"note":"<img src=x onerror=alert(1)>"}`, i)))
		if i <= failed {
			msg.Metadata.Set("fail", "1")
		}
		require.NoError(t, recv.Handle(msg))
	}
	handler, handled := signalHandled(func(msg *message.Message) ([]*message.Message, error) {
		if msg.Metadata.Get("fail") == "1" {
			return nil, errors.New("card declined: <b>insufficient funds</b>")
		}
		return nil, nil
	})
	proc, err := inbox.NewProcessor(db, handler, inbox.ProcessorConfig{Schema: f.schema, Consumer: "billing", Workers: 1, MaxAttempts: 1,
		PollInterval: 20 * time.Millisecond, ShutdownGrace: testsignal.Timeout}, nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- proc.Run(ctx) }()
	waitHandled(t, handled, failed+1)
	// Close lets the attempts under way record their outcome (within ShutdownGrace).
	require.NoError(t, proc.Close())
	require.NoError(t, <-done)
	require.Equal(t, failed, f.count(t, "FAILED"))
	require.Equal(t, 1, f.count(t, "DONE"))
	return f
}

// signalHandled wraps an inbox handler: the returned channel receives the UUID of each message
// it handled, once it returned.
func signalHandled(h message.HandlerFunc) (message.HandlerFunc, <-chan string) {
	handled := make(chan string, 100)
	return func(msg *message.Message) ([]*message.Message, error) {
		defer func() { handled <- msg.UUID }()
		return h(msg)
	}, handled
}

// waitHandled waits until n different messages were handled.
func waitHandled(t *testing.T, handled <-chan string, n int) {
	t.Helper()
	seen := map[string]bool{}
	for len(seen) < n {
		seen[testwait.Receive(t, handled, fmt.Sprintf("%d of %d messages handled", len(seen)+1, n))] = true
	}
}

// relayUntil runs relay rounds until done holds (relaytest.RunUntil; two idle rounds: the first
// may only close the previous round).
func relayUntil(t *testing.T, relay *outbox.Relay, what string, done func(outbox.RelayCounters) bool) {
	t.Helper()
	relaytest.RunUntil(t, relay, what, 2, done)
}

// count returns how many of billing's inbox rows have status.
func (f *fixture) count(t *testing.T, status string) int {
	return pgtest.Count(t, f.db, `SELECT count(*) FROM `+f.table("inbox")+` WHERE consumer = 'billing' AND status = $1`, status)
}

func (f *fixture) rowStatus(t *testing.T, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, f.db.QueryRow(`SELECT status FROM `+f.table("inbox")+` WHERE id = $1`, id).Scan(&s))
	return s
}

func (f *fixture) ids(t *testing.T, status string) []int64 {
	t.Helper()
	rows, err := f.db.Query(`SELECT id FROM `+f.table("inbox")+` WHERE consumer = 'billing' AND status = $1 ORDER BY id`, status)
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

// server starts the handler on a real listener.
func (f *fixture) server(t *testing.T, cfg admin.Config) *httptest.Server {
	t.Helper()
	srv, _ := f.serve(t, cfg)
	return srv
}

// serve is server that also returns the handler (to take samples).
func (f *fixture) serve(t *testing.T, cfg admin.Config) (*httptest.Server, *admin.Handler) {
	t.Helper()
	cfg.Schema = f.schema
	h, err := admin.NewHandler(f.db, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.Close()) })
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, h
}

// relayAll has relay sms forward the row the fixture left waiting, so its backlog is 0.
func (f *fixture) relayAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{Schema: f.schema, Name: "sms"}, nil)
	require.NoError(t, err)
	relayUntil(t, relay, "forward the row left waiting", func(c outbox.RelayCounters) bool { return c.Forwarded >= 1 })
	relays, _, err := outbox.Stats(ctx, f.db, f.schema)
	require.NoError(t, err)
	require.Len(t, relays, 1)
	require.Zero(t, relays[0].Backlog)
}
