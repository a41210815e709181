package once_test

import (
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// BenchmarkIsolationInterleaved weighs the isolation level and the concurrency a handler runs
// under, in rounds that run every variant in turn so that the load of a shared machine falls on
// all of them alike. Each message goes through once.Stack with its default Retry; an error that
// comes out of it is a nack, and the message is delivered again after 100ms (the brokers'
// default NackDelay), as a broker would.
//
// Two workloads:
//   - insert: one business row per message, nothing shared (what does the isolation level cost
//     when nothing conflicts?);
//   - counter: one hot row that every handler reads and writes back plus one
//     (SELECT v; UPDATE SET v = read + 1): is the count exact, and at what throughput?
//
// Variants are named workload-isolation[-gc][-attempts]-inflight: rc, rr, ser for READ
// COMMITTED, REPEATABLE READ and SERIALIZABLE; gc for group commit (2 lanes); attempts is
// TxRetry.MaxAttempts, followed by bBackoff when not the default (both default when absent);
// inflight is how many messages are handled at once (8: RabbitMQ's default Workers; 3: Kafka's
// default partitions; 1: Watermill's own AMQP subscriber). Reported per variant: the median
// msgs/s and the median of its per-round ratio to the first variant of its workload; per
// message over all rounds, the transactions re-run after a serialization failure (TxRetry),
// the errors the middleware returned to the Stack's Retry, the nacks, and for the counter the
// updates lost. BENCH_MSGS and BENCH_HOT_MSGS size the rounds of each workload.
//
//	BENCH_ROUNDS=7 BENCH_HOT_MSGS=400 go test -run '^$' -bench IsolationInterleaved -benchtime 1x ./middleware/once/
func BenchmarkIsolationInterleaved(b *testing.B) {
	db := pgtest.OpenDB(b, 40)
	schema := pgtest.Schema(b, db)
	effects, counters := pgtx.QualifiedName(schema, "effects"), pgtx.QualifiedName(schema, "counters")
	pgtest.Exec(b, db, `CREATE TABLE `+effects+` (id bigserial PRIMARY KEY, key text NOT NULL, payload bytea NOT NULL)`)
	pgtest.Exec(b, db, `CREATE TABLE `+counters+` (id text PRIMARY KEY, v bigint NOT NULL)`)
	insert := `INSERT INTO ` + effects + ` (key, payload) VALUES ($1, $2)`
	read, write := `SELECT v FROM `+counters+` WHERE id = $1`, `UPDATE `+counters+` SET v = $2 WHERE id = $1`
	insertHandler := func(msg *message.Message) error {
		tx, _ := pgtx.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), insert, msg.UUID, msg.Payload)
		return err
	}
	// The counter example's handler: read, add one, write back. Never v = v + 1, which would be
	// correct at any isolation level and hide the question.
	counterHandler := func(msg *message.Message) error {
		tx, _ := pgtx.TxFromContext(msg.Context())
		ctx, id := msg.Context(), msg.Metadata.Get("counter")
		var v int64
		if err := tx.QueryRowContext(ctx, read, id).Scan(&v); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, write, id, v+1)
		return err
	}
	iso := map[string]sql.IsolationLevel{"rc": sql.LevelReadCommitted, "rr": sql.LevelRepeatableRead, "ser": sql.LevelSerializable}
	type variant struct {
		name     string
		counter  bool
		inFlight int
		h        message.HandlerFunc
		mw       *once.Middleware
		rates    []float64
		lost     int64
		nacks    atomic.Int64
		// stackRetries counts errors the middleware returned to the Stack's Retry (the last
		// of each message's Stack attempts is also a nack).
		stackRetries atomic.Int64
	}
	newVariant := func(workload, level string, retry pgtx.RetryPolicy, inFlight int, group bool) *variant {
		v := &variant{counter: workload == "counter", inFlight: inFlight}
		v.name = workload + "-" + level
		if group {
			v.name += "-gc"
		}
		if retry.MaxAttempts != 0 {
			v.name += "-" + strconv.Itoa(retry.MaxAttempts)
		}
		if retry.Backoff != 0 {
			v.name += "b" + retry.Backoff.String()
		}
		v.name += "-" + strconv.Itoa(inFlight)
		mw, err := once.New(db, once.Config{Schema: schema, Consumer: v.name,
			TxOptions: &sql.TxOptions{Isolation: iso[level]}, TxRetry: retry,
			GroupCommit: once.GroupCommitConfig{Disabled: !group}}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = mw.Close() })
		stack, err := once.Stack(once.StackConfig{Middleware: mw})
		if err != nil {
			b.Fatal(err)
		}
		h := insertHandler
		if v.counter {
			h = counterHandler
		}
		v.h = func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
		// Without Timeout and PoisonPublisher the Stack is Retry -> Middleware -> ...: count
		// what the middleware hands to Retry (its TxRetry attempts spent).
		for i := len(stack) - 1; i >= 1; i-- {
			v.h = stack[i](v.h)
		}
		inner := v.h
		v.h = stack[0](func(msg *message.Message) ([]*message.Message, error) {
			out, err := inner(msg)
			if err != nil {
				v.stackRetries.Add(1)
			}
			return out, err
		})
		v.mw = mw
		return v
	}
	inFlight := envInt("BENCH_IN_FLIGHT", 8)
	def, a3, a10 := pgtx.RetryPolicy{}, pgtx.RetryPolicy{MaxAttempts: 3}, pgtx.RetryPolicy{MaxAttempts: 10}
	a10b1 := pgtx.RetryPolicy{MaxAttempts: 10, Backoff: time.Millisecond}
	variants := []*variant{
		newVariant("insert", "rc", def, inFlight, false),
		newVariant("insert", "rr", def, inFlight, false),
		newVariant("insert", "ser", def, inFlight, false),
		newVariant("insert", "rc", def, 1, false),
		newVariant("insert", "rc", def, inFlight, true),
		newVariant("insert", "rr", def, inFlight, true),
		newVariant("counter", "rc", def, 1, false), // the reference of the counter variants: exact, one at a time
		newVariant("counter", "rc", def, inFlight, false),
		newVariant("counter", "rr", a3, inFlight, false),
		newVariant("counter", "rr", a10, inFlight, false),
		newVariant("counter", "rr", a10b1, inFlight, false),
		newVariant("counter", "ser", a10, inFlight, false),
		newVariant("counter", "rc", def, 3, false),
		newVariant("counter", "rr", a3, 3, false),
		newVariant("counter", "rr", a10, 3, false),
		newVariant("counter", "rr", a3, inFlight, true),
		newVariant("counter", "rr", a10, inFlight, true),
	}
	rounds, msgs, hotMsgs := envInt("BENCH_ROUNDS", 5), envInt("BENCH_MSGS", 500), envInt("BENCH_HOT_MSGS", 200)
	var run int64
	payload := make([]byte, 256)
	for _, v := range variants[:4] { // warm up: open the pool's connections
		deliverWithRedelivery(b, v.h, &v.nacks, v.inFlight, 50, payload, 0, "")
	}
	for range rounds {
		for _, v := range variants {
			run++
			n := msgs
			counter := ""
			if v.counter {
				n, counter = hotMsgs, "c"+strconv.FormatInt(run, 10)
				pgtest.Exec(b, db, `INSERT INTO `+counters+` (id, v) VALUES ($1, 0)`, counter)
			}
			v.rates = append(v.rates, deliverWithRedelivery(b, v.h, &v.nacks, v.inFlight, n, payload, run, counter))
			if v.counter {
				v.lost += int64(n - pgtest.Count(b, db, `SELECT v FROM `+counters+` WHERE id = $1`, counter))
			}
		}
	}
	b.StopTimer()
	var ref *variant
	for _, v := range variants {
		if ref == nil || ref.counter != v.counter {
			ref = v
		}
		b.ReportMetric(median(v.rates), v.name+"-msgs/s")
		if v != ref {
			ratios := make([]float64, rounds)
			for r := range rounds {
				ratios[r] = v.rates[r] / ref.rates[r]
			}
			b.ReportMetric(median(ratios), v.name+"/"+ref.name)
		}
		total := float64(rounds * msgs)
		if v.counter {
			total = float64(rounds * hotMsgs)
			b.ReportMetric(float64(v.lost)/total, v.name+"-lost/msg")
		}
		b.ReportMetric(float64(v.mw.Counters().Consumer(v.name).TxRetries)/total, v.name+"-txretries/msg")
		b.ReportMetric(float64(v.stackRetries.Load())/total, v.name+"-stackerrs/msg")
		b.ReportMetric(float64(v.nacks.Load())/total, v.name+"-nacks/msg")
	}
}

// deliverWithRedelivery pushes n unique messages through h from inFlight goroutines and returns
// msgs/s. A message h fails is nacked (counted in nacks) and delivered again after 100ms, as
// the brokers' default nack delay does. counter, when set, is the "counter" metadata of every
// message.
func deliverWithRedelivery(b *testing.B, h message.HandlerFunc, nacks *atomic.Int64, inFlight, n int, payload []byte, run int64, counter string) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				msg := message.NewMessage(fmt.Sprintf("iso%d-%d", run, i), payload)
				msg.Metadata.Set("counter", counter)
				for attempt := 0; ; attempt++ {
					_, err := h(msg.Copy())
					if err == nil {
						break
					}
					nacks.Add(1)
					if attempt == 100 {
						b.Error(err)
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}
