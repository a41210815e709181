package oncetest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/effects/versioned"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/oncetest"
	"github.com/wmonce/watermill-once/pgtx"
)

// deliveryKey is the metadata key the kit sets on each copy it delivers ("e<event>c<copy>"):
// the handlers below read it to misbehave on one copy only.
const deliveryKey = "oncetest_delivery"

// The patterns the docs recommend must pass the kit with no violation: a false positive
// teaches users to ignore it.

// TestPermanentRefusalIsNoViolation: the Quick start refuses an event it cannot decode with
// wmonce.Permanent. The kit expects that event refused in every mode, under every fault.
func TestPermanentRefusalIsNoViolation(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{Events: func() []*message.Message {
		bad := message.NewMessage("00000000-0000-4000-8000-0000000000ff", []byte(`not a number`))
		bad.Metadata.Set("account", "a")
		return append(b.events(), bad)
	}})
	t.Logf("seed %d", kit.Seed())
	var refused, applied atomic.Int32
	require.Empty(t, kit.Check(t, func(msg *message.Message) ([]*message.Message, error) {
		if _, err := strconv.Atoi(string(msg.Payload)); err != nil {
			refused.Add(1)
			return nil, wmonce.Permanent(err) // the Quick start's refusal: parked, never retried
		}
		applied.Add(1)
		return b.correct(msg)
	}))
	require.Positive(t, refused.Load(), "the undecodable event reached the handler")
	require.Positive(t, applied.Load(), "the others were applied")
}

// TestVersionedApplyDeltaUnderReorderIsNoViolation: the README's answer to order. Delivered
// out of order, a later delta waits (a retryable gap error) until the earlier one arrives; the
// kit must let the earlier one through in every mode.
func TestVersionedApplyDeltaUnderReorderIsNoViolation(t *testing.T) {
	b := newBank(t)
	v, err := versioned.New(versioned.Config{Schema: b.schema})
	require.NoError(t, err)
	versions := pgtx.QualifiedName(b.schema, "entity_versions")
	kit := b.kit(t, oncetest.Config{
		Events: func() []*message.Message {
			perAccount := map[string]int{}
			events := b.events()
			for _, m := range events {
				account := m.Metadata.Get("account")
				perAccount[account]++
				m.Metadata.Set("version", strconv.Itoa(perAccount[account]))
			}
			return events
		},
		Reset: func(ctx context.Context, db *sql.DB) error {
			if _, err := db.ExecContext(ctx, `DELETE FROM `+versions); err != nil {
				return err
			}
			return b.reset(ctx, db)
		},
	})
	t.Logf("seed %d", kit.Seed())
	var gaps atomic.Int32
	require.Empty(t, kit.Check(t, func(msg *message.Message) ([]*message.Message, error) {
		version, err := strconv.ParseInt(msg.Metadata.Get("version"), 10, 64)
		if err != nil {
			return nil, err // not Permanent: the test's own events always carry one
		}
		tx, _ := pgtx.TxFromContext(msg.Context())
		var out []*message.Message
		_, err = v.ApplyDelta(msg.Context(), tx, versioned.Entity{Type: "account", ID: msg.Metadata.Get("account")}, version,
			func(context.Context) error {
				out, err = b.correct(msg)
				return err
			})
		if errors.Is(err, versioned.ErrVersionGap) {
			gaps.Add(1)
		}
		return out, err
	}))
	require.Positive(t, gaps.Load(), "a later event arrived before an earlier one and waited for it")
}

// TestReadModifyWriteForUpdateIsNoViolation: the README's read-modify-write made exact at
// the inbox's READ COMMITTED default with SELECT ... FOR UPDATE, in every mode.
func TestReadModifyWriteForUpdateIsNoViolation(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{})
	t.Logf("seed %d", kit.Seed())
	var applied atomic.Int32
	require.Empty(t, kit.Check(t, func(msg *message.Message) ([]*message.Message, error) {
		out, err := b.readModifyWrite(msg, " FOR UPDATE", nil)
		if err == nil {
			applied.Add(1)
		}
		return out, err
	}))
	require.Positive(t, applied.Load())
}

// readModifyWrite reads the balance through the lent transaction (with lock, if given), calls
// between (if not nil), and writes back the balance computed from what it read.
func (b *bank) readModifyWrite(msg *message.Message, lock string, between func()) ([]*message.Message, error) {
	tx, _ := pgtx.TxFromContext(msg.Context())
	account, amount, err := deposit(msg)
	if err != nil {
		return nil, err
	}
	var balance int64
	if err := tx.QueryRowContext(msg.Context(), `SELECT balance FROM `+b.accounts+` WHERE id = $1`+lock, account).Scan(&balance); err != nil {
		return nil, err
	}
	if between != nil {
		between()
	}
	if _, err := tx.ExecContext(msg.Context(), `UPDATE `+b.accounts+` SET balance = $2 WHERE id = $1`, account, balance+int64(amount)); err != nil {
		return nil, err
	}
	_, err = tx.ExecContext(msg.Context(), `INSERT INTO `+b.ledger+` VALUES ($1, $2, $3)`, msg.UUID, account, amount)
	return nil, err
}

// TestNonJSONPayloadIsNoViolation: payloads and outputs that are not JSON (protobuf bytes, not
// even UTF-8), and a long UUID, go through every mode, the watermill-sql subscriber's included.
func TestNonJSONPayloadIsNoViolation(t *testing.T) {
	b := newBank(t)
	// A protobuf-like encoding: a tag byte, the amount as one byte, and bytes no UTF-8 text has.
	encode := func(amount int) []byte { return []byte{0x08, byte(amount), 0xff, 0xfe, 0x00} }
	kit := b.kit(t, oncetest.Config{Events: func() []*message.Message {
		events := b.events()
		for _, m := range events {
			amount, err := strconv.Atoi(string(m.Payload))
			require.NoError(t, err)
			m.Payload = encode(amount)
		}
		// And a UUID longer than watermill-sql's default column holds (36): the library takes it.
		events[0].UUID = "order-events/" + strings.Repeat("7", 80)
		return events
	}})
	t.Logf("seed %d", kit.Seed())
	var decoded atomic.Int32
	require.Empty(t, kit.Check(t, func(msg *message.Message) ([]*message.Message, error) {
		if len(msg.Payload) != 5 || msg.Payload[0] != 0x08 {
			return nil, wmonce.Permanent(fmt.Errorf("not a deposit: % x", msg.Payload))
		}
		decoded.Add(1)
		plain := msg.Copy()
		plain.SetContext(msg.Context())
		plain.Payload = []byte(strconv.Itoa(int(msg.Payload[1])))
		if _, err := b.correct(plain); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), append([]byte{0x10}, msg.Payload[1:]...))}, nil
	}))
	require.Positive(t, decoded.Load(), "the binary payloads reached the handler intact")
}

// What a buggy handler gets: a report whose hint follows what was seen, with the last error.

// TestSelfAckingHandlerIsCaughtInEveryMode: a handler that acks the message it was given
// (then writes its effect) is an early ack in every mode. It acks only on a second attempt of
// a delivery, which the reference never makes, so each mode's own run must catch it.
func TestSelfAckingHandlerIsCaughtInEveryMode(t *testing.T) {
	for _, mode := range oncetest.AllModes {
		t.Run(string(mode), func(t *testing.T) {
			b := newBank(t)
			var mu sync.Mutex
			calls := map[string]int{}
			kit := oncetest.New(t, oncetest.Config{
				DB: b.db, Schema: b.schema, Events: b.events, Effect: b.effect,
				Modes: []oncetest.Mode{mode}, Faults: []oncetest.Fault{oncetest.FaultTransient},
				Reset: func(ctx context.Context, db *sql.DB) error {
					mu.Lock()
					clear(calls)
					mu.Unlock()
					return b.reset(ctx, db)
				},
			})
			vs := expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
				mu.Lock()
				calls[msg.Metadata.Get(deliveryKey)]++
				again := calls[msg.Metadata.Get(deliveryKey)] > 1
				mu.Unlock()
				if again {
					msg.Ack() // the bug: the ack is the library's, after the commit
				}
				return b.correct(msg)
			}, "an early ack")
			require.Equal(t, mode, vs[0].Mode)
			require.Contains(t, vs[0].Seen, "acked the message it was given")
		})
	}
}

// TestSelfAckInTheReferenceIsCaught: a handler that acks every message is caught on the
// clean delivery already.
func TestSelfAckInTheReferenceIsCaught(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{})
	expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
		msg.Ack()
		return b.correct(msg)
	}, "an early ack")
}

// TestLostUpdateAtReadCommittedIsReportedAsLess: a read-modify-write without a lock at the
// inbox's READ COMMITTED default loses an update when two deliveries overlap (the handler
// waits, after its read, for a second one to read). The report says less than the reference
// and a lost update, and blames neither duplicates, nor order, nor writes through the pool.
func TestLostUpdateAtReadCommittedIsReportedAsLess(t *testing.T) {
	b := newBank(t)
	var runs atomic.Int32
	var reads atomic.Int32
	var overlap atomic.Pointer[chan struct{}]
	kit := oncetest.New(t, oncetest.Config{
		DB: b.db, Schema: b.schema, Events: b.events, Effect: b.effect,
		Modes: []oncetest.Mode{oncetest.ModeInbox}, Faults: []oncetest.Fault{oncetest.FaultConcurrentEvents},
		Reset: func(ctx context.Context, db *sql.DB) error {
			runs.Add(1)
			reads.Store(0)
			ch := make(chan struct{})
			overlap.Store(&ch)
			return b.reset(ctx, db)
		},
	})
	vs := expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
		return b.readModifyWrite(msg, "", func() {
			if runs.Load() == 1 || msg.Metadata.Get("account") != "a" {
				return // the reference delivers one at a time: nothing to overlap with
			}
			ch := *overlap.Load()
			if reads.Add(1) == 2 {
				close(ch)
			}
			select { // a bound, not a pause: the second reader normally arrives at once
			case <-ch:
			case <-time.After(10 * time.Second):
			}
		})
	}, "a lost update")
	v := vs[0]
	require.Contains(t, v.Seen, "less than")
	require.Contains(t, v.Hint, "READ COMMITTED")
	for _, wrong := range []string{"duplicate", "arrival order", "writes through the pool"} {
		require.NotContains(t, v.Hint, wrong)
	}
	require.NotEqual(t, v.Effect, v.WantEffect)
}

// TestAlwaysFailingHandlerIsReportedWithItsLastError: a handler that fails every delivery is
// reported on the clean run with its last error, and the hint does not speak of an event that
// applies cleanly once.
func TestAlwaysFailingHandlerIsReportedWithItsLastError(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{})
	vs := expectCaught(t, kit, func(*message.Message) ([]*message.Message, error) {
		return nil, errors.New(`relation "cashback_credits" does not exist`)
	}, "fails on a clean delivery")
	v := vs[0]
	require.Contains(t, v.LastError, `relation "cashback_credits" does not exist`)
	require.Contains(t, v.Seen, `relation "cashback_credits" does not exist`, "the cause is kept in what was seen")
	require.NotContains(t, v.Hint, "applies cleanly once")
	require.NotContains(t, v.Hint, "applied cleanly once")
}

// TestHandlerFailingEveryRedeliveryIsReportedWithItsLastError: a handler that applies a clean
// delivery but fails every attempt after a rolled-back one is reported with that error.
func TestHandlerFailingEveryRedeliveryIsReportedWithItsLastError(t *testing.T) {
	b := newBank(t)
	var mu sync.Mutex
	calls := map[string]int{}
	kit := oncetest.New(t, oncetest.Config{
		DB: b.db, Schema: b.schema, Events: b.events, Effect: b.effect,
		Modes: []oncetest.Mode{oncetest.ModeOwnTx}, Faults: []oncetest.Fault{oncetest.FaultTransient},
		Reset: func(ctx context.Context, db *sql.DB) error {
			mu.Lock()
			clear(calls)
			mu.Unlock()
			return b.reset(ctx, db)
		},
	})
	vs := expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
		mu.Lock()
		calls[msg.UUID]++
		again := calls[msg.UUID] > 1
		mu.Unlock()
		if again { // the bug: it remembers in memory that it ran
			return nil, errors.New("payment already being processed")
		}
		return b.correct(msg)
	}, "keeps failing after")
	v := vs[0]
	require.Contains(t, v.Seen, "payment already being processed")
	require.Contains(t, v.LastError, "payment already being processed")
	require.True(t, strings.Contains(v.Seen, "still failing after"), v.Seen)
}

// TestShutdownGraceIsSetPerMode: the kit sets once.Config.ShutdownGrace per mode, as its doc
// says: under FaultShutdown the cancelled handler keeps a live context in the own-transaction
// mode (it may commit within the grace) and loses it at once with group commit (the attempt
// is rolled back), whatever the application's Middleware sets.
func TestShutdownGraceIsSetPerMode(t *testing.T) {
	for _, c := range []struct {
		mode      oncetest.Mode
		cancelled bool
	}{{oncetest.ModeOwnTx, false}, {oncetest.ModeGroupCommit, true}} {
		t.Run(string(c.mode), func(t *testing.T) {
			b := newBank(t)
			var mu sync.Mutex
			calls := map[string]int{}
			var cancelled atomic.Int32
			kit := oncetest.New(t, oncetest.Config{
				DB: b.db, Schema: b.schema, Events: b.events, Effect: b.effect,
				Modes: []oncetest.Mode{c.mode}, Faults: []oncetest.Fault{oncetest.FaultShutdown},
				Middleware: func(cfg *once.Config) { cfg.ShutdownGrace = time.Minute },
				Reset: func(ctx context.Context, db *sql.DB) error {
					mu.Lock()
					clear(calls)
					mu.Unlock()
					cancelled.Store(0)
					return b.reset(ctx, db)
				},
			})
			require.Empty(t, kit.Check(t, func(msg *message.Message) ([]*message.Message, error) {
				mu.Lock()
				calls[msg.Metadata.Get(deliveryKey)]++
				first := calls[msg.Metadata.Get(deliveryKey)] == 1
				mu.Unlock()
				if first {
					// A bound for the case where nothing cancels the context (the grace holds).
					select {
					case <-msg.Context().Done():
						cancelled.Add(1)
					case <-time.After(500 * time.Millisecond):
					}
				}
				return b.correct(msg)
			}))
			// Reset ran last before the shutdown run: the count is that run's.
			if c.cancelled {
				require.Equal(t, int32(1), cancelled.Load(), "the shut-down handler's context ends at once in a group")
			} else {
				require.Zero(t, cancelled.Load(), "the shut-down handler keeps its context within the grace")
			}
		})
	}
}

// TestPanicOnCleanDeliveryIsCaught: a panic is never the documented way to refuse an event
// (wmonce.Permanent is): on the clean delivery it is a violation, not an expected refusal.
func TestPanicOnCleanDeliveryIsCaught(t *testing.T) {
	b := newBank(t)
	kit := b.kit(t, oncetest.Config{})
	vs := expectCaught(t, kit, func(msg *message.Message) ([]*message.Message, error) {
		if msg.Metadata.Get("account") == "b" {
			var accounts map[string]int
			accounts["b"]++ //nolint:staticcheck // the bug under test: a write to a nil map panics
		}
		return b.correct(msg)
	}, "panics on a clean delivery")
	require.Contains(t, vs[0].Seen, "event 3")
}
