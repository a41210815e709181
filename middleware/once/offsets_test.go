package once_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgnotify"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/pgtx"
)

// offsetWatch tells a test when watermill-sql's subscriber has committed an acked offset. The
// subscriber commits after the ack, in a goroutine of its own, and offers no signal, so a test
// could only poll its offsets table. Instead a trigger on the table notifies, and PostgreSQL
// delivers a notification only when the transaction that sent it commits: a subscriber
// transaction whose commit fails (one the middleware doomed) sends none.
type offsetWatch struct {
	db      *sql.DB
	schema  string
	channel string

	mu    sync.Mutex
	acked map[offsetsOf]chan int64
}

// offsetsOf names one consumer group's offsets of one topic.
type offsetsOf struct{ table, group string }

// watchOffsets LISTENs, on a connection of db, for the offset commits of every watermill-sql
// subscriber in schema, until the test ends; watch then picks the topics.
func watchOffsets(t testing.TB, db *sql.DB, schema string) *offsetWatch {
	t.Helper()
	w := &offsetWatch{db: db, schema: schema, channel: pgnotify.Channel("offsets_", schema), acked: map[offsetsOf]chan int64{}}
	pgtest.Exec(t, db, `CREATE FUNCTION `+pgtx.QualifiedName(schema, "notify_offset")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify(TG_ARGV[0], TG_TABLE_NAME || ' ' || NEW.offset_acked || ' ' || NEW.consumer_group);
	RETURN NEW;
END $$`)
	ctx, cancel := context.WithCancel(context.Background())
	listening, stopped := make(chan struct{}), make(chan struct{})
	var ready sync.Once
	go func() {
		defer close(stopped)
		_ = pgnotify.Listener{
			DB:       db,
			Channels: map[string]func(string){w.channel: w.notified},
			OnListen: func() { ready.Do(func() { close(listening) }) },
		}.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-stopped })
	testwait.Closed(t, listening, "LISTEN for the offset commits")
	return w
}

// notified hands a commit's offset to the test watching its table and group.
func (w *offsetWatch) notified(payload string) {
	table, rest, _ := strings.Cut(payload, " ")
	offset, group, _ := strings.Cut(rest, " ")
	n, err := strconv.ParseInt(offset, 10, 64)
	if err != nil {
		return
	}
	w.mu.Lock()
	ch := w.acked[offsetsOf{table, group}]
	w.mu.Unlock()
	select {
	case ch <- n:
	default: // no test watches (nil), or it reads none of them: never block the listener
	}
}

// watch returns the offsets group commits on topic, in commit order, from the next commit on.
// The offsets table must exist: the subscriber creates it when it subscribes.
func (w *offsetWatch) watch(topic, group string) (<-chan int64, error) {
	table := "watermill_offsets_" + topic
	ch := make(chan int64, 1000)
	w.mu.Lock()
	w.acked[offsetsOf{table, group}] = ch
	w.mu.Unlock()
	_, err := w.db.Exec(`CREATE OR REPLACE TRIGGER notify_offset AFTER INSERT OR UPDATE ON ` + pgtx.QualifiedName(w.schema, table) +
		` FOR EACH ROW EXECUTE FUNCTION ` + pgtx.QualifiedName(w.schema, "notify_offset") + `(` + sqlLiteral(w.channel) + `)`)
	if err != nil {
		return nil, fmt.Errorf("watch the offsets of %s: %w", topic, err)
	}
	return ch, nil
}

// ackedOffsets is watch for a test: it fails t when the trigger cannot be created.
func (w *offsetWatch) ackedOffsets(t testing.TB, topic, group string) <-chan int64 {
	t.Helper()
	ch, err := w.watch(topic, group)
	require.NoError(t, err)
	return ch
}

// waitAcked waits until a commit of offset n or a later one arrives on acked.
func waitAcked(t testing.TB, acked <-chan int64, n int64) {
	t.Helper()
	for testwait.Receive(t, acked, fmt.Sprintf("the subscriber to commit offset %d", n)) < n {
	}
}

// sqlLiteral quotes s as a SQL string literal (standard_conforming_strings, the default).
func sqlLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }
