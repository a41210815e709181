package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
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
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// result is one in-process run of the CLI.
type result struct {
	code           int
	stdout, stderr string
}

// wmonce runs the CLI against the test database and schema.
func runCLI(t *testing.T, schema string, args ...string) result {
	t.Helper()
	return wmonceRaw(t, append([]string{"-database-url", pgtest.URL(), "-schema", schema}, args...)...)
}

func wmonceRaw(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// fixture is a schema filled by the real components:
//   - consumer "rewards" (effectively-once middleware) applied m-1, m-2, m-3 and m-4, saw m-1
//     twice, and emitted one outbox row per message to topic "cashback";
//   - relay "sms" forwarded the first three outbox rows, so one is waiting (backlog 1);
//   - inbox consumer "billing" received inv-1..inv-5, processed by a Processor whose handler
//     fails for every message marked fail=1 (MaxAttempts 1): inv-1, inv-3 and inv-5 are FAILED,
//     inv-2 is DONE, and inv-4 waits PENDING behind inv-3 (same ordering key order-7).
type fixture struct {
	db     *sql.DB
	schema string
	mw     *once.Middleware
}

func (f *fixture) table(name string) string { return pgtx.QualifiedName(f.schema, name) }

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := pgtest.DB(t)
	f := &fixture{db: db, schema: pgtest.Schema(t, db)}
	ctx := context.Background()

	mw, err := once.New(db, once.Config{Schema: f.schema, Consumer: "rewards", OutputTopic: "cashback"}, nil)
	require.NoError(t, err)
	f.mw = mw
	h := mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"granted":`+string(msg.Payload)+`}`))}, nil
	})
	deliver := func(uuid string) {
		_, err := h(message.NewMessage(uuid, []byte(`1`)))
		require.NoError(t, err)
	}
	for _, id := range []string{"m-1", "m-2", "m-3", "m-1"} {
		deliver(id)
	}

	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Schema: f.schema, Name: "sms", BatchSize: 10}, nil)
	require.NoError(t, err)
	relayUntil(t, relay, "forward 3 rows", func(c outbox.RelayCounters) bool { return c.Forwarded >= 3 })
	deliver("m-4") // its outbox row is the backlog

	recv, err := inbox.NewReceiver(db, inbox.ReceiverConfig{Schema: f.schema, Consumer: "billing", OrderingKey: func(m *message.Message) (string, error) {
		return m.Metadata.Get("key"), nil
	}}, nil)
	require.NoError(t, err)
	defer recv.Close()
	for _, m := range []struct{ id, key, fail string }{
		{"inv-1", "", "1"}, {"inv-2", "", ""}, {"inv-3", "order-7", "1"}, {"inv-4", "order-7", ""}, {"inv-5", "order-9", "1"},
	} {
		msg := message.NewMessage(m.id, []byte(`{"invoice":"`+m.id+`"}`))
		msg.Metadata.Set("key", m.key)
		msg.Metadata.Set("fail", m.fail)
		require.NoError(t, recv.Handle(msg))
	}
	handled := make(chan string, 10)
	proc, err := inbox.NewProcessor(db, func(msg *message.Message) ([]*message.Message, error) {
		defer func() { handled <- msg.UUID }()
		if msg.Metadata.Get("fail") == "1" {
			return nil, errors.New("card declined")
		}
		return nil, nil
	}, inbox.ProcessorConfig{Schema: f.schema, Consumer: "billing", Workers: 1, MaxAttempts: 1, PollInterval: 20 * time.Millisecond, ShutdownGrace: testsignal.Timeout}, nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- proc.Run(ctx) }()
	// Every message but inv-4 is handled once. Stop processing, letting the last attempt record
	// its outcome, so that what the tests change stays as they left it.
	for seen := map[string]bool{}; len(seen) < 4; {
		seen[testwait.Receive(t, handled, "inv-1, inv-2, inv-3 and inv-5 handled")] = true
	}
	require.NoError(t, proc.Close())
	require.NoError(t, <-done)
	require.Equal(t, 3, f.status(t, "FAILED"))
	require.Equal(t, 1, f.status(t, "DONE"))
	require.Equal(t, 1, f.status(t, "PENDING"), "inv-4 waits behind inv-3")
	return f
}

// relayUntil runs relay rounds until done holds (relaytest.RunUntil; two idle rounds: the first
// may only close the previous round).
func relayUntil(t *testing.T, relay *outbox.Relay, what string, done func(outbox.RelayCounters) bool) {
	t.Helper()
	relaytest.RunUntil(t, relay, what, 2, done)
}

func (f *fixture) status(t *testing.T, status string) int {
	return pgtest.Count(t, f.db, `SELECT count(*) FROM `+f.table("inbox")+` WHERE consumer = 'billing' AND status = $1`, status)
}

func (f *fixture) rowStatus(t *testing.T, messageID string) string {
	t.Helper()
	var s string
	require.NoError(t, f.db.QueryRow(`SELECT status FROM `+f.table("inbox")+` WHERE consumer = 'billing' AND message_id = $1`, messageID).Scan(&s))
	return s
}

func (f *fixture) rowID(t *testing.T, messageID string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, f.db.QueryRow(`SELECT id FROM `+f.table("inbox")+` WHERE consumer = 'billing' AND message_id = $1`, messageID).Scan(&id))
	return id
}
