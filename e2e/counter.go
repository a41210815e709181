package e2e

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e/internal/scenario"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Defaults of CounterOptions (Producers: DefaultProducers).
const (
	DefaultCounterEvents  = 600
	DefaultCounterTimeout = 4 * time.Minute
)

// CounterOptions sizes RunCounter.
type CounterOptions struct {
	// ConsumerBinary is the path of the built e2e/internal/consumer command. Required.
	ConsumerBinary string
	// Events is how many events the producers commit. Default DefaultCounterEvents (600).
	Events int
	// Producers run concurrently, without pause, so that many messages are in flight at once.
	// Default DefaultProducers (4).
	Producers int
	// Timeout bounds the whole run. Default DefaultCounterTimeout (4 minutes).
	Timeout time.Duration
}

func (o *CounterOptions) setDefaults() {
	o.Events = cmp.Or(o.Events, DefaultCounterEvents)
	o.Producers = cmp.Or(o.Producers, DefaultProducers)
	o.Timeout = cmp.Or(o.Timeout, DefaultCounterTimeout)
}

// RunCounter checks that a read-modify-write handler is exact under the library's defaults on
// one broker: CounterHandler (read one counter row, add one in Go, write it back) behind
// once.New and once.Stack configured with nothing but the schema and the consumer name, fed by
// the broker configured by target.Config (the broker's own defaults for concurrency: Kafka's
// partitions, RabbitMQ's workers, the SQL subscriber). Two consumer processes share the group;
// the relay republishes every third batch (duplicates); each consumer is killed with SIGKILL
// mid-stream and restarted. At the end the counter must equal the number of events, and its
// sum the orders' sum: every event applied once, no update lost to a concurrent handler.
func RunCounter(t *testing.T, target Target, opts CounterOptions) {
	pgtest.SkipShort(t) // before the commands are asked for: a -short run builds none
	opts.setDefaults()
	require.NotEmpty(t, opts.ConsumerBinary, "CounterOptions.ConsumerBinary: build e2e/internal/consumer first")
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()

	topic, group := pgtest.NewName("orders"), "counter"
	r := newRig(ctx, t, target, "e2e_counter", outbox.RelayConfig{
		// Small batches: the publisher fails every third call, so 600 events make at least 60
		// calls and 20 republished batches however far the producers run ahead of the relay
		// (with the default batch size a loaded machine let 600 events go out in two calls).
		BatchSize: 10, PollInterval: 20 * time.Millisecond,
	},
		broker.Subscription{Topic: topic, Group: group})
	require.NoError(t, scenario.CreateCounterTable(ctx, r.control, r.schema))
	fleet := r.fleet(t, opts.ConsumerBinary, "counter-"+target.Name+"-"+r.appName,
		scenario.EnvTopic+"="+topic, scenario.EnvGroup+"="+group, scenario.EnvHandler+"="+scenario.HandlerCounter)
	a, c := fleet.start("a"), fleet.start("b")

	var produced atomic.Int64
	prodErr := make(chan error, opts.Producers)
	var producers sync.WaitGroup
	perProducer := opts.Events / opts.Producers
	total := perProducer * opts.Producers
	for p := range opts.Producers {
		producers.Go(func() {
			for i := range perProducer {
				ev := scenario.Event{OrderID: fmt.Sprintf("o-%d-%05d", p, i), Amount: int64(100 + (p*perProducer+i)%997)}
				if err := scenario.Produce(ctx, r.app, r.writer, r.schema, topic, ev, fmt.Sprintf("customer-%d", i%7)); err != nil {
					prodErr <- err
					return
				}
				produced.Add(1)
			}
		})
	}
	q := func(query string, args ...any) int { return pgtest.Count(t, r.control, query, args...) }
	claimsQuery := `SELECT count(*) FROM ` + pgtx.QualifiedName(r.schema, "processed_messages") + ` WHERE consumer = $1`
	// Claims, not the counter, tell progress: they are exact whatever the handler does, so a
	// counter that lost updates fails the check below instead of a wait.
	claims := func() int { return q(claimsQuery, group) }
	var faults faultLog
	killAt := func(p *proc, n int) *proc {
		require.Eventually(t, func() bool { return claims() >= n }, opts.Timeout, 10*time.Millisecond,
			"progress: want %d applied; consumer logs: %s", n, fleet.logTails())
		faults.add("SIGKILL consumer %s mid-stream (%d produced, %d applied), restarted", p.name, produced.Load(), claims())
		return fleet.kill(p)
	}
	a = killAt(a, total/4)
	c = killAt(c, total/2)

	producers.Wait()
	close(prodErr)
	for err := range prodErr {
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return claims() >= total }, opts.Timeout, 50*time.Millisecond,
		"every event applied (%d of %d so far); consumer logs: %s", claims(), total, fleet.logTails())
	quietSince, last := time.Now(), fleet.deliveries()
	require.Eventually(t, func() bool {
		if d := fleet.deliveries(); d != last {
			last, quietSince = d, time.Now()
		}
		return time.Since(quietSince) > 1500*time.Millisecond && r.crashy.idleFor() > time.Second
	}, opts.Timeout, 50*time.Millisecond)
	fleet.stop(a)
	fleet.stop(c)
	require.NoError(t, r.relay.Close())

	for _, f := range faults.list() {
		t.Logf("e2e counter[%s] fault injected: %s", target.Name, f)
	}
	var n, sum int64
	counter := pgtx.QualifiedName(r.schema, "counter")
	require.NoError(t, r.control.QueryRowContext(ctx, `SELECT n, total FROM `+counter+` WHERE id = 1`).Scan(&n, &sum))
	ordersSum := q(`SELECT sum(amount)::bigint FROM ` + pgtx.QualifiedName(r.schema, "orders"))
	pubStats, st := r.crashy.stats(), fleet.totals()
	t.Logf("e2e counter[%s]: %d events, counter %d (sum %d of %d); %d claims; relay republished %d events; consumers (%d process runs): %d deliveries, %d duplicates absorbed, %d attempts rolled back; %s",
		target.Name, total, n, sum, ordersSum, claims(), pubStats.republishedEvents, fleet.runs(), st.Deliveries, st.Duplicates, st.Failed, time.Since(began).Round(time.Millisecond))
	require.Equal(t, total, claims(), "one dedupe claim per event")
	require.Equal(t, int64(total), n, "the read-modify-write counter counts every event once: %d updates lost", int64(total)-n)
	require.Equal(t, int64(ordersSum), sum, "the counter's sum equals the orders' sum")
	require.Positive(t, pubStats.republishedEvents, "the relay republished events")
	require.Positive(t, st.Duplicates, "copies reached the consumers and were absorbed")
}
