package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/worker"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// brokerStandIn accepts messages, except that it refuses for good the UUIDs in refuse and
// fails (transiently) every call to a topic in down, as a broker would.
type brokerStandIn struct {
	mu     sync.Mutex
	refuse map[string]bool
	down   map[string]bool
	got    []string
}

func (b *brokerStandIn) Publish(topic string, msgs ...*message.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down[topic] {
		return errors.New("kafka server: Request was for a topic or partition that does not exist on this broker")
	}
	for _, m := range msgs {
		if b.refuse[m.UUID] {
			return wmonce.Permanent(errors.New("kafka server: Message was too large, server rejected it to avoid allocation error"))
		}
	}
	for _, m := range msgs {
		b.got = append(b.got, topic+"/"+m.UUID)
	}
	return nil
}
func (b *brokerStandIn) Close() error { return nil }

func storeOutbox(t *testing.T, db *sql.DB, schema, topic string, uuids ...string) {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, pgtx.RunInTx(context.Background(), db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		for _, u := range uuids {
			if err := w.PublishTx(ctx, tx, topic, message.NewMessage(u, []byte(`{"n":1}`))); err != nil {
				return err
			}
		}
		return nil
	}))
}

// The rows a relay set aside are listed, inspected and republished from the CLI; the topics it
// holds are shown with the outbox stats.
func TestOutboxRejectedRowsAndHeldTopics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	b := &brokerStandIn{refuse: map[string]bool{"too-big": true}, down: map[string]bool{"missing": true}}
	relay, err := outbox.NewRelay(f.db, b, outbox.RelayConfig{Schema: f.schema, Name: "kafka", Backoff: time.Millisecond, MaxBackoff: time.Millisecond}, nil)
	require.NoError(t, err)
	storeOutbox(t, f.db, f.schema, "orders", "o-1", "too-big", "o-2")
	storeOutbox(t, f.db, f.schema, "missing", "m-1")
	// The fixture's rows, and these.
	relayUntil(t, relay, "reject too-big and hold topic missing", func(c outbox.RelayCounters) bool { return c.Rejected == 1 && c.HeldTopics == 1 })

	r := runCLI(t, f.schema, "outbox")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "relay kafka holds topic missing: 1 row(s) wait since")
	require.Contains(t, r.stdout, "1 row(s) were set aside in outbox_rejected")
	require.Contains(t, r.stdout, "`wmonce outbox rejected`")
	for _, sub := range []string{"stats", "status"} { // status: the older name
		again := runCLI(t, f.schema, "outbox", sub)
		require.Equal(t, exitOK, again.code, again.stderr)
		require.Contains(t, again.stdout, "relay kafka holds topic missing: 1 row(s) wait since", "outbox %s is the default action", sub)
	}

	r = runCLI(t, f.schema, "outbox", "rejected")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^\d+\s+kafka\s+too-big\s+orders\s+\S+ \S+\s+permanent: kafka server: Message was too large`, r.stdout)
	r = runCLI(t, f.schema, "-json", "outbox", "rejected", "-relay", "kafka")
	require.Equal(t, exitOK, r.code, r.stderr)
	var rows []operate.RejectedRow
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rows))
	require.Len(t, rows, 1)
	offset := strconv.FormatInt(rows[0].Offset, 10)

	r = runCLI(t, f.schema, "outbox", "inspect", offset)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"uuid":"too-big"`)
	require.Contains(t, r.stdout, "outbox republish -relay kafka -offset "+offset)

	r = runCLI(t, f.schema, "outbox", "republish", "-relay", "kafka", "-offset", offset, "-dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `dry run: would republish 1 row(s) rejected by relay "kafka"`)
	b.mu.Lock()
	b.refuse, b.down = nil, nil // the operator fixed the broker
	b.mu.Unlock()
	r = runCLI(t, f.schema, "outbox", "republish", "-relay", "kafka", "-all")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `republished 1 row(s) rejected by relay "kafka"`)
	_, err = relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Subset(t, b.got, []string{"orders/o-1", "orders/o-2", "missing/m-1", "orders/too-big"})
	r = runCLI(t, f.schema, "outbox", "rejected")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "no rejected outbox rows")

	// A republish that matches no row (the row went back to the outbox above) is an error, as
	// a failures action on an emptied group is: a script must not read "0 rows" as done.
	for _, args := range [][]string{{"-offset", offset}, {"-all"}, {"-offset", offset, "-dry-run"}} {
		r = runCLI(t, f.schema, append([]string{"outbox", "republish", "-relay", "kafka"}, args...)...)
		require.Equal(t, exitFailure, r.code, "%v: %s", args, r.stdout)
		require.Contains(t, r.stderr, `nothing to republish: relay "kafka" has no rejected row`, "%v", args)
		require.Contains(t, r.stderr, "`wmonce outbox rejected -relay kafka` lists them", "%v", args)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"outbox", "republish", "-all"}, "-relay is required"},
		{[]string{"outbox", "republish", "-relay", "kafka"}, "name the rows with -offset, or give -all"},
		{[]string{"outbox", "republish", "-relay", "kafka", "-all", "-offset", "1"}, "not both"},
		{[]string{"outbox", "republish", "-relay", "kafka", "-offset", "x"}, "positive outbox offsets"},
		{[]string{"outbox", "inspect"}, "give the outbox offset"},
		{[]string{"outbox", "rejectd"}, `did you mean "rejected"`},
		{[]string{"outbox", "rejected", "-relay", "k\x00"}, "-relay must not contain NUL"},
	} {
		r := runCLI(t, f.schema, tc.args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, "%v", tc.args)
	}
}

// `wmonce outbox forget` removes a retired relay's position, so that it no longer holds back
// outbox cleanup; it refuses while the relay runs, and -dry-run changes nothing.
func TestOutboxForget(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // relay "sms" has one row it has not forwarded
	ctx := context.Background()

	r := runCLI(t, f.schema, "outbox", "forget")
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "-relay is required")
	r = runCLI(t, f.schema, "outbox", "forget", "-relay", "nope")
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, `no relay of that name has a position in this schema: "nope" (relays: "sms")`)

	r = runCLI(t, f.schema, "outbox", "forget", "-relay", "sms", "-dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `dry run: would forget relay "sms" (source ""): 1 row(s) it had not forwarded`)
	relays, _, err := outbox.Stats(ctx, f.db, f.schema)
	require.NoError(t, err)
	require.Len(t, relays, 1, "a dry run forgets nothing")

	live, err := outbox.NewRelay(f.db, &brokerStandIn{}, outbox.RelayConfig{Schema: f.schema, Name: "live"}, nil)
	require.NoError(t, err)
	leading := worker.LeadingSignal(worker.LockKey("relay", f.schema, "live")) // the relay's lock key
	done := make(chan error, 1)
	go func() { done <- live.Run(ctx) }()
	t.Cleanup(func() { require.NoError(t, live.Close()); require.NoError(t, <-done) })
	leading.WaitOrTimeout()
	r = runCLI(t, f.schema, "outbox", "forget", "-relay", "live")
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Contains(t, r.stderr, `the relay is running: stop every instance of it first (relay "live")`)

	r = runCLI(t, f.schema, "-json", "outbox", "forget", "-relay", "sms")
	require.Equal(t, exitOK, r.code, r.stderr)
	var res operate.ForgetResponse
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res))
	require.Equal(t, "sms", res.Relay)
	require.Equal(t, int64(1), res.Backlog)
	relays, _, err = outbox.Stats(ctx, f.db, f.schema)
	require.NoError(t, err)
	require.Len(t, relays, 1)
	require.Equal(t, "live", relays[0].Name, "sms is forgotten")
}
