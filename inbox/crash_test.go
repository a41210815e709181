package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// crashConfig is the configuration of the crash tests: one worker, three attempts.
func crashConfig() inbox.ProcessorConfig {
	cfg := fast("c")
	cfg.Workers, cfg.MaxAttempts = 1, 3
	return cfg
}

// A handler whose backend is terminated under it (pg_terminate_backend, as an out-of-memory
// kill or a crashing query would) has had an attempt: it counts, so a message that does this
// every time is parked after MaxAttempts instead of being given back uncounted forever.
func TestTerminatedBackendCountsTheAttempt(t *testing.T) {
	t.Parallel()
	cfg := crashConfig()
	e := newEnv(t)
	r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
	require.NoError(t, r.Handle(msg("m1", "x")))
	var runs atomic.Int32
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		tx, _ := pgtx.TxFromContext(m.Context())
		if err := e.effect(m, "w"); err != nil {
			return nil, err
		}
		var pid int
		if err := tx.QueryRowContext(m.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return nil, err
		}
		var gone bool // waits up to 10s for the backend to exit
		if err := e.db.QueryRowContext(context.Background(), `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&gone); err != nil || !gone {
			return nil, errors.Join(errors.New("could not terminate the backend"), err)
		}
		_, err := tx.ExecContext(m.Context(), `SELECT 1`)
		return nil, err
	}, cfg)

	p.until(t, "the row parked", func(n tally) bool { return n.Parked == 1 })
	row, err := e.ops.InspectMessage(context.Background(), "c", "m1")
	require.NoError(t, err)
	require.Equal(t, 3, row.Attempts)
	require.Contains(t, row.LastError, "connection ended during the attempt")
	require.EqualValues(t, 3, runs.Load(), "one run per counted attempt")
	require.Zero(t, e.effects(t), "no effect of a terminated attempt commits")
}

// Environment of the child process TestInboxCrashChild runs in.
const (
	crashChildEnv  = "WMONCE_INBOX_CRASH_CHILD"
	crashSchemaEnv = "WMONCE_INBOX_CRASH_SCHEMA"
	crashBatchEnv  = "WMONCE_INBOX_CRASH_TXBATCH"
)

// A message that kills its worker's process (SIGKILL in the handler, as an out-of-memory kill
// would) is counted on every run and parked after MaxAttempts. Each run
// is a child process: this test binary, re-executed to run TestInboxCrashChild. With
// TxBatchSize 4 the message first dies together with three innocent neighbours; they lose that
// one attempt only, are then processed apart from it, and are not parked with it. (They would
// also lose any attempt of their own that fails or outruns HandlerTimeout or its lease; the child's bounds are long so that a loaded machine does not cause that.)
func TestProcessCrashIsCountedUntilParked(t *testing.T) {
	t.Parallel()
	for _, txBatch := range []int{1, 4} {
		t.Run(fmt.Sprintf("txbatch=%d", txBatch), func(t *testing.T) {
			t.Parallel()
			cfg := crashConfig()
			e := newEnv(t)
			r := e.receiver(t, inbox.ReceiverConfig{Consumer: "c"})
			ids := []string{"doomed"}
			if txBatch > 1 {
				ids = []string{"ok-1", "doomed", "ok-2", "ok-3"}
			}
			storeAll(t, e, r, func() (msgs []*message.Message) {
				for _, id := range ids {
					msgs = append(msgs, msg(id, "x"))
				}
				return msgs
			}())

			kills := 0
			var outs []string // the children's output, logged if the test fails
			t.Cleanup(func() {
				if t.Failed() {
					for _, o := range outs {
						t.Log(o)
					}
				}
			})
			for run := 1; ; run++ {
				// MaxAttempts runs that kill themselves, then one that parks the row.
				require.LessOrEqual(t, run, cfg.MaxAttempts+1, "the row is still not parked after %d killed runs: crashes are not counted", kills)
				child := exec.Command(os.Args[0], "-test.run=^TestInboxCrashChild$", "-test.count=1", "-test.v="+strconv.FormatBool(testing.Verbose()))
				child.Env = append(os.Environ(), crashChildEnv+"=1", crashSchemaEnv+"="+e.schema,
					crashBatchEnv+"="+strconv.Itoa(txBatch))
				out, err := child.CombinedOutput()
				outs = append(outs, fmt.Sprintf("=== child %d\n%s", run, out))
				var exit *exec.ExitError
				if errors.As(err, &exit) {
					if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
						kills++
						// The child is gone (we waited for it): its leases run out now
						// rather than after Lease, as if that much time had passed.
						pgtest.Exec(t, e.db, `UPDATE `+e.table("inbox")+` SET lease_until = now() WHERE status = 'IN_PROGRESS'`)
						continue
					}
				}
				require.NoError(t, err, "child run %d:\n%s", run, out)
				break // the child saw every row finished
			}
			require.Equal(t, cfg.MaxAttempts, kills)
			row, err := e.ops.InspectMessage(context.Background(), "c", "doomed")
			require.NoError(t, err)
			require.Equal(t, inbox.StatusFailed, row.Status)
			require.Equal(t, cfg.MaxAttempts, row.Attempts)
			for _, id := range ids {
				if id == "doomed" {
					continue
				}
				row, err := e.ops.InspectMessage(context.Background(), "c", id)
				require.NoError(t, err)
				require.Equal(t, inbox.StatusDone, row.Status, id)
				require.LessOrEqual(t, row.Attempts, 2, "%s lost one attempt at most to its neighbour; last error %q", id, row.LastError)
			}
			require.Equal(t, len(ids)-1, e.effects(t), "each innocent row applied once, the doomed one never")
		})
	}
}

// TestInboxCrashChild is the child process of TestProcessCrashIsCountedUntilParked; run on
// its own it does nothing. It processes the schema's inbox with a handler that kills the
// process on the message "doomed", and returns once every row is finished or parked.
func TestInboxCrashChild(t *testing.T) {
	if os.Getenv(crashChildEnv) != "1" {
		t.Skip("child process of TestProcessCrashIsCountedUntilParked")
	}
	db := pgtest.OpenDB(t, 8)
	e := &env{db: db, schema: os.Getenv(crashSchemaEnv)}
	cfg := fast("c")
	cfg.Workers, cfg.MaxAttempts = 1, 3
	// Long enough that no innocent attempt outruns its lease or HandlerTimeout, however
	// loaded the machine: that would cost it an attempt of its own (as documented), which is
	// not what this test is about. The parent expires a dead child's leases itself.
	cfg.Lease, cfg.HandlerTimeout = time.Minute, time.Minute
	cfg.TxBatchSize, _ = strconv.Atoi(os.Getenv(crashBatchEnv))
	cfg.BatchSize = cfg.TxBatchSize
	p := e.start(t, func(m *message.Message) ([]*message.Message, error) {
		if err := e.effect(m, "w"); err != nil {
			return nil, err
		}
		if m.UUID == "doomed" {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns
		}
		return nil, nil
	}, cfg)
	// Every run starts with a row left to finish: the doomed row kills the run that takes it,
	// until a run parks it. Earlier runs may have finished some rows, so the table says when
	// this run is done, read after each row it settles.
	untilSettled(t, "every row finished or parked", func() bool {
		return pgtest.Count(t, db, `SELECT count(*) FROM `+e.table("inbox")+` WHERE status IN ('PENDING', 'IN_PROGRESS')`) == 0
	}, p)
}
