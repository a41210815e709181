package pgnotify_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/pgnotify"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
)

// PostgreSQL truncates identifiers at 63 bytes: long schema names must map to distinct
// channels that fit, short ones stay readable.
func TestChannelFitsAndStaysDistinct(t *testing.T) {
	require.Equal(t, "wmonce_outbox_app", pgnotify.Channel("wmonce_outbox_", "app"))
	a := pgnotify.Channel("wmonce_outbox_", strings.Repeat("s", 60)+"a")
	b := pgnotify.Channel("wmonce_outbox_", strings.Repeat("s", 60)+"b")
	require.LessOrEqual(t, len(a), pgnotify.MaxChannelLength)
	require.NotEqual(t, a, b)
}

type notification struct{ channel, payload string }

// listener runs a Listener on two channels of its own until the test ends, and returns the
// channels, what it receives, and a signal each time LISTEN is (re)established.
func listener(t *testing.T, db *sql.DB, own bool) (channels [2]string, got <-chan notification, listening <-chan struct{}, lost <-chan error) {
	t.Helper()
	name := pgtest.NewName("n")
	channels = [2]string{"a_" + name, "b_" + name}
	gotCh := make(chan notification, 16)
	listenCh := make(chan struct{}, 16)
	lostCh := make(chan error, 16)
	notify := func(channel string) func(string) {
		return func(payload string) { gotCh <- notification{channel, payload} }
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- pgnotify.Listener{
			DB:            db,
			Channels:      map[string]func(string){channels[0]: notify(channels[0]), channels[1]: notify(channels[1])},
			OwnConnection: own,
			OnListen:      func() { listenCh <- struct{}{} },
			OnLost:        func(err error, _ time.Duration) { lostCh <- err },
		}.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "Run returns nil when its context ends")
	})
	return channels, gotCh, listenCh, lostCh
}

// forEachConnection runs f, on a pool of its own, with a connection of the pool and with one
// of the listener's own.
func forEachConnection(t *testing.T, f func(t *testing.T, db *sql.DB, own bool)) {
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprintf("OwnConnection=%v", own), func(t *testing.T) {
			t.Parallel()
			f(t, pgtest.OpenDB(t, 4), own)
		})
	}
}

// lastListen is the last statement of a connection that LISTENs on channels (in name order).
func lastListen(channels [2]string) string { return `LISTEN "` + channels[1] + `"` }

// listenBackends counts the server sessions whose last statement LISTENed on one of channels.
func listenBackends(t *testing.T, channels [2]string) int {
	t.Helper()
	return pgtest.Count(t, pgtest.DB(t), `SELECT count(*) FROM pg_stat_activity WHERE query IN ($1, $2)`,
		`LISTEN "`+channels[0]+`"`, lastListen(channels))
}

// Several channels share one connection: of the pool's, held while listening, or of the
// listener's own, outside the pool. Each channel's notifications reach its function.
func TestListenerDeliversSeveralChannelsOnOneConnection(t *testing.T) {
	t.Parallel()
	forEachConnection(t, func(t *testing.T, db *sql.DB, own bool) {
		channels, got, listening, _ := listener(t, db, own)
		testwait.Receive(t, listening, "LISTEN")
		require.Equal(t, 1, listenBackends(t, channels), "one session LISTENs on both channels")
		inUse := 1
		if own {
			inUse = 0
		}
		require.Equal(t, inUse, db.Stats().InUse, "pool connections held by the listener")

		pgtest.Exec(t, db, `SELECT pg_notify($1, 'x'), pg_notify($2, 'y')`, channels[0], channels[1])
		require.Equal(t, notification{channels[0], "x"}, testwait.Receive(t, got, "the first channel's notification"))
		require.Equal(t, notification{channels[1], "y"}, testwait.Receive(t, got, "the second channel's notification"))
	})
}

// A listening connection that dies is reported and re-established, LISTENing on every channel
// again, and OnListen is called again (notifications meanwhile went to nobody).
func TestListenerReconnectsAfterItsConnectionDies(t *testing.T) {
	t.Parallel()
	forEachConnection(t, func(t *testing.T, db *sql.DB, own bool) {
		channels, got, listening, lost := listener(t, db, own)
		testwait.Receive(t, listening, "LISTEN")
		var killed bool
		require.NoError(t, pgtest.DB(t).QueryRow(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1`, lastListen(channels)).Scan(&killed))
		require.True(t, killed)
		require.Error(t, testwait.Receive(t, lost, "the lost connection reported"))
		testwait.Receive(t, listening, "LISTEN again")
		pgtest.Exec(t, db, `SELECT pg_notify($1, 'after')`, channels[1])
		require.Equal(t, notification{channels[1], "after"}, testwait.Receive(t, got, "a notification after the reconnect"))
	})
}

// notPgx is a database/sql driver that is not pgx's: its connections do nothing.
type notPgx struct{}

func (notPgx) Open(string) (driver.Conn, error)        { return notPgxConn{}, nil }
func (notPgxConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not supported") }
func (notPgxConn) Close() error                        { return nil }
func (notPgxConn) Begin() (driver.Tx, error)           { return nil, errors.New("not supported") }

type notPgxConn struct{}

func init() { sql.Register("pgnotify-test-not-pgx", notPgx{}) }

// With a driver other than pgx's, Run returns ErrNotPgx at once (callers then poll), with or
// without a connection of its own.
func TestListenerRefusesADriverThatIsNotPgx(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("pgnotify-test-not-pgx", "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	for _, own := range []bool{false, true} {
		err := pgnotify.Listener{DB: db, Channels: map[string]func(string){"c": func(string) {}}, OwnConnection: own}.Run(context.Background())
		require.ErrorIs(t, err, pgnotify.ErrNotPgx, "OwnConnection=%v", own)
	}
	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	defer conn.Close()
	require.False(t, pgnotify.IsPgx(conn))
}
