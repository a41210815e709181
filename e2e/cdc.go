package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e/internal/scenario"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox/cdc"
	"github.com/wmonce/watermill-once/pgtx"
)

// Fault kinds of the CDC fault pass, besides FaultConsumerKill, FaultPGRestart and
// FaultBrokerRestart.
const (
	// FaultWorkerKill is a SIGKILL of the Connect worker running the connector's task, then a
	// restart of that worker once the task runs again (on the other worker).
	FaultWorkerKill = "worker_kill"
)

// CDCOptions sizes a CDC fault pass.
type CDCOptions struct {
	// Binaries of e2e/internal/consumer and producer. Required.
	ConsumerBinary, ProducerBinary string
	// Config is the broker configuration of the consumers (Kafka, on the cluster the Connect
	// workers write to). Required.
	Config func(t *testing.T, schema string) broker.Config
	// ConnectURL is a worker's REST API. Default cdc.DefaultConnectURL.
	ConnectURL string
	// Workers are the REST ports of the Connect workers, in e2e/services order (worker 1
	// first). Default 8083, 8084.
	Workers []string
	// KafkaLine is the e2e/services line of the broker to restart. Default "4".
	KafkaLine string
	// Events the producer processes commit. Default 2000.
	Events int
	// Producers is the number of producer processes. Default 2.
	Producers int
	// Pace is each producer's pause between events. Default 80ms: the producers run for
	// about 90 s, long enough for every fault to hit while events flow.
	Pace time.Duration
	// Seed makes the nemesis's choices reproducible; 0 picks one.
	Seed uint64
	// Timeout bounds the run. Default 10 minutes.
	Timeout time.Duration
}

func (o *CDCOptions) setDefaults() {
	o.ConnectURL = cmp.Or(o.ConnectURL, cdc.DefaultConnectURL)
	if len(o.Workers) == 0 {
		o.Workers = []string{"8083", "8084"}
	}
	o.KafkaLine = cmp.Or(o.KafkaLine, "4")
	o.Events = cmp.Or(o.Events, 2000)
	o.Producers = cmp.Or(o.Producers, 2)
	o.Pace = cmp.Or(o.Pace, 80*time.Millisecond)
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	o.Timeout = cmp.Or(o.Timeout, 10*time.Minute)
}

// CDCReport is the one-line JSON summary of a CDC fault pass (printed as
// "e2e cdc report: {json}").
type CDCReport struct {
	Seed               uint64         `json:"seed"`
	Events             int            `json:"events"`
	Deliveries         uint64         `json:"deliveries"`
	DuplicatesAbsorbed uint64         `json:"duplicates_absorbed"`
	Lost               int            `json:"lost"`
	AppliedTwice       int            `json:"applied_twice"`
	OrderViolations    int            `json:"order_violations"`
	Faults             map[string]int `json:"faults"`
	// FaultsUnderLoad counts the faults injected while producers were still committing.
	FaultsUnderLoad int `json:"faults_under_load"`
	// TaskRestarts counts FAILED tasks the harness restarted through the REST API, as an
	// operator (or Strimzi's auto-restart) would: Connect itself does not restart them.
	TaskRestarts  int     `json:"task_restarts"`
	RecoveryMsP50 int64   `json:"recovery_ms_p50"`
	RecoveryMsMax int64   `json:"recovery_ms_max"`
	WorkerKillMs  []int64 `json:"worker_kill_recovery_ms"`
	DurationS     float64 `json:"duration_s"`
}

// cdcMinimum is how often each fault must hit a pass.
var cdcMinimum = map[string]int{FaultWorkerKill: 1, FaultPGRestart: 1, FaultBrokerRestart: 1, FaultConsumerKill: 2}

// RunCDC is the CDC fault pass: producer processes commit orders and their events through the
// outbox.Writer, Debezium's connector (in a Kafka Connect cluster of two workers) moves them to
// Kafka, two consumer processes apply them with the effectively-once middleware. A seeded
// nemesis injects, in a random order, at least: a SIGKILL of the worker running the task (then
// its restart), an immediate-mode PostgreSQL restart, a Kafka broker restart and consumer
// kills. It checks that every event is applied once, none lost, and that each key's events
// are applied in their commit order, and logs one "e2e cdc report: {json}" line.
//
// It restarts PostgreSQL, the Kafka broker and a Connect worker: nothing else may use them.
func RunCDC(t *testing.T, opts CDCOptions) CDCReport {
	opts.setDefaults()
	require.NotEmpty(t, opts.ConsumerBinary)
	require.NotEmpty(t, opts.ProducerBinary)
	t.Logf("e2e cdc: seed %d", opts.Seed)
	rng := rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15))
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()

	control := pgtest.OpenDB(t, 4)
	schema := pgtest.Schema(t, control)
	require.NoError(t, scenario.CreateTables(ctx, control, schema))
	topic, poisonTopic, group := pgtest.NewName("orders"), pgtest.NewName("parked"), "ledger"
	cfg := opts.Config(t, schema)
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: group}}
	b, err := broker.New(ctx, control, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.Declare(ctx, cfg.Subscriptions...))

	client := cdc.Client{URL: opts.ConnectURL}
	conn := cdc.Config{Schema: schema, DatabaseURL: pgtest.URL(), User: cdc.DefaultReplicationRole}.WithDefaults()
	require.NoError(t, cdc.Prepare(ctx, control, conn))
	require.NoError(t, client.Apply(ctx, conn))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := cdc.Remove(ctx, client, control, conn); err != nil {
			t.Errorf("remove the connector: %v", err)
		}
	})
	faults := &chaosFaults{counts: map[string]int{}}
	taskRestarts := 0
	var lastStatus time.Time
	var last cdc.Status
	// status reads the connector's state through any worker that answers (one may be dead),
	// at most every 200ms, and restarts a FAILED task as an operator would.
	status := func() (cdc.Status, bool) {
		if time.Since(lastStatus) < 200*time.Millisecond {
			return last, true
		}
		for _, port := range opts.Workers {
			c := cdc.Client{URL: "http://127.0.0.1:" + port}
			s, err := c.Status(ctx, conn.Name)
			if err != nil {
				continue
			}
			for _, tk := range s.Tasks {
				if tk.State.State == "FAILED" {
					taskRestarts++
					faults.note(fmt.Sprintf("task %d FAILED on %s, restarted: %.300s", tk.ID, tk.WorkerID, tk.Trace))
					_ = c.RestartTask(ctx, conn.Name, tk.ID)
				}
			}
			last, lastStatus = s, time.Now()
			return s, true
		}
		return cdc.Status{}, false
	}
	running := func() bool {
		s, ok := status()
		slot, err := cdc.Slot(ctx, control, conn)
		return ok && s.Running() && err == nil && slot.Active
	}
	waitFor(t, ctx, 2*time.Minute, running, func() string { return "the connector's task to run and read its slot" })

	logDir := t.TempDir()
	if d := os.Getenv("E2E_LOG_DIR"); d != "" {
		logDir = filepath.Join(d, "cdc-"+schema)
		require.NoError(t, os.MkdirAll(logDir, 0o755))
	}
	env := append(cfg.Environ(), scenario.EnvSchema+"="+schema, scenario.EnvTopic+"="+topic,
		scenario.EnvPoisonTopic+"="+poisonTopic, scenario.EnvGroup+"="+group,
		scenario.EnvInOrder+"=1") // the pass checks each key's commit order: no delayed retries
	consumers := &fleet{t: t, bin: opts.ConsumerBinary, dir: logDir, env: env}
	consumerA := superviseProc(t, consumers, "a", nil)
	consumerB := superviseProc(t, consumers, "b", nil)
	t.Cleanup(func() {
		consumerA.shutdown()
		consumerB.shutdown()
		consumers.killAll()
	})

	per := opts.Events / opts.Producers
	total := per * opts.Producers
	var producers []*fleet
	var producerProcs []*proc
	for i := range opts.Producers {
		f := &fleet{t: t, bin: opts.ProducerBinary, dir: logDir, env: append(slices.Clone(env),
			fmt.Sprintf("%s=%d", scenario.EnvProduceFrom, i*per), fmt.Sprintf("%s=%d", scenario.EnvProduceCount, per),
			scenario.EnvProducePace+"="+opts.Pace.String())}
		producers = append(producers, f)
		producerProcs = append(producerProcs, f.start(fmt.Sprintf("p%d", i)))
	}
	t.Cleanup(func() {
		for _, f := range producers {
			f.killAll()
		}
	})
	producersDone := func() bool {
		for _, p := range producerProcs {
			select {
			case <-p.done:
			default:
				return false
			}
		}
		return true
	}
	q := func(query string, args ...any) int { return ctlCount(ctx, t, control, query, args...) }
	ledger, orders := pgtx.QualifiedName(schema, "ledger"), pgtx.QualifiedName(schema, "orders")
	applied := func() int { return q(`SELECT count(*) FROM ` + ledger) }

	var workerKills []int64
	inject := func(kind string) {
		switch kind {
		case FaultConsumerKill:
			c := consumerA
			if rng.IntN(2) == 1 {
				c = consumerB
			}
			faults.add(kind, "SIGKILL consumer "+c.name)
			c.kill()
		case FaultWorkerKill:
			s, ok := status()
			require.True(t, ok && len(s.Tasks) > 0, "no worker answers with the connector's status")
			n := slices.IndexFunc(opts.Workers, func(p string) bool { return strings.HasSuffix(s.Tasks[0].WorkerID, ":"+p) })
			require.GreaterOrEqual(t, n, 0, "task runs on %s, not a worker of %v", s.Tasks[0].WorkerID, opts.Workers)
			worker := strconv.Itoa(n + 1)
			at := time.Now()
			faults.add(kind, "SIGKILL Connect worker "+worker+" ("+s.Tasks[0].WorkerID+"), which runs the task")
			require.NoError(t, ServicesScript(ctx, "connect-kill", worker))
			waitFor(t, ctx, 3*time.Minute, func() bool {
				s, ok := status()
				return ok && s.Running() && !strings.HasSuffix(s.Tasks[0].WorkerID, ":"+opts.Workers[n])
			}, func() string { return "the task to move to the other worker" })
			workerKills = append(workerKills, time.Since(at).Milliseconds())
			faults.note(fmt.Sprintf("task moved after %s; restarting worker %s", time.Since(at).Round(time.Millisecond), worker))
			require.NoError(t, ServicesScript(ctx, "connect-start", worker))
		case FaultPGRestart:
			faults.add(kind, "PostgreSQL immediate-mode restart")
			require.NoError(t, ServicesScript(ctx, "pg-crash"))
		case FaultBrokerRestart:
			faults.add(kind, "Kafka broker SIGKILL and start")
			require.NoError(t, ServicesScript(ctx, "kafka-kill", opts.KafkaLine))
			require.NoError(t, ServicesScript(ctx, "kafka-start", opts.KafkaLine))
		}
	}
	kinds := []string{FaultWorkerKill, FaultPGRestart, FaultBrokerRestart, FaultConsumerKill}
	// The faults start once events flow end to end: a recovery time then measures the fault,
	// not the consumers' first group join.
	waitFor(t, ctx, 3*time.Minute, func() bool { status(); return applied() > 0 }, func() string {
		return "the consumers to apply a first event; logs: " + consumers.logTails()
	})
	var recoveries []time.Duration
	underLoad := 0
	for {
		var unmet []string
		for _, k := range kinds {
			if faults.get(k) < cdcMinimum[k] {
				unmet = append(unmet, k)
			}
		}
		if len(unmet) == 0 && producersDone() {
			break
		}
		require.NoError(t, ctx.Err(), "cdc run timed out; faults so far: %v", faults.counts)
		time.Sleep(DefaultChaosMinGap + time.Duration(rng.Int64N(int64(DefaultChaosMaxGap-DefaultChaosMinGap)+1))) // the nemesis's random interval
		kind := kinds[rng.IntN(len(kinds))]
		if len(unmet) > 0 {
			kind = unmet[rng.IntN(len(unmet))]
		}
		if faults.get(FaultWorkerKill) == 0 {
			kind = FaultWorkerKill // the headline fault first, while events surely flow
		}
		if !producersDone() {
			underLoad++
		}
		before, at := applied(), time.Now()
		inject(kind)
		if before < total {
			waitFor(t, ctx, 3*time.Minute, func() bool { status(); return applied() > before }, func() string {
				return fmt.Sprintf("no progress after %s (faults %v); logs: %s", kind, faults.counts, consumers.logTails())
			})
			recoveries = append(recoveries, time.Since(at))
			faults.note(fmt.Sprintf("progress resumed %s after %s", time.Since(at).Round(time.Millisecond), kind))
		}
	}
	for _, p := range producerProcs {
		require.True(t, p.cmd.ProcessState.Success(), "producer %s exited with %v; log:\n%s", p.name, p.cmd.ProcessState, tail(p.logPath))
	}
	waitFor(t, ctx, opts.Timeout, func() bool { status(); return applied() >= total }, func() string {
		return fmt.Sprintf("every event applied (%d of %d); logs: %s", applied(), total, consumers.logTails())
	})
	quietSince, lastCount := time.Now(), consumers.deliveries()
	waitFor(t, ctx, time.Minute, func() bool {
		if d := consumers.deliveries(); d != lastCount {
			lastCount, quietSince = d, time.Now()
		}
		return time.Since(quietSince) > 2*time.Second
	}, func() string { return "the consumers kept receiving copies" })
	consumerA.stop()
	consumerB.stop()

	rows, distinct := q(`SELECT count(*) FROM `+ledger), q(`SELECT count(DISTINCT event_id) FROM `+ledger)
	lost := q(`SELECT count(*) FROM ` + orders + ` o WHERE NOT EXISTS (SELECT 1 FROM ` + ledger + ` l WHERE l.order_id = o.id)`)
	// Per-key order: the producer processes commit their events one after another, keyed
	// customer-(n mod 7); within one producer and one key, a later event must be applied later.
	// The ledger's applied_at is the applying transaction's start; ctid breaks no ties (one key
	// is applied by one consumer at a time, on one partition).
	violations := q(`SELECT count(*) FROM (
    SELECT n, lag(n) OVER (PARTITION BY n / $1, n % 7 ORDER BY applied_at, n) AS prev
    FROM (SELECT substr(order_id, 3)::int AS n, applied_at FROM `+ledger+`) l
) x WHERE prev > n`, per)
	st := consumers.totals()
	report := CDCReport{
		Seed: opts.Seed, Events: total, Deliveries: st.Deliveries, DuplicatesAbsorbed: st.Duplicates,
		Lost: lost, AppliedTwice: rows - distinct, OrderViolations: violations, TaskRestarts: taskRestarts, FaultsUnderLoad: underLoad,
		WorkerKillMs: workerKills, DurationS: time.Since(began).Round(100 * time.Millisecond).Seconds(),
		Faults: map[string]int{},
	}
	for _, k := range kinds {
		report.Faults[k] = faults.get(k)
	}
	report.RecoveryMsP50, report.RecoveryMsMax = percentiles(recoveries)
	line, _ := json.Marshal(report)
	for _, f := range faults.list() {
		t.Logf("e2e cdc fault: %s", f)
	}
	t.Logf("e2e cdc report: %s", line)

	require.Equal(t, total, q(`SELECT count(*) FROM `+orders), "every producer transaction committed once")
	require.Zero(t, lost, "nothing lost")
	require.Zero(t, report.AppliedTwice, "nothing applied twice")
	require.Zero(t, violations, "each key's events applied in commit order")
	require.Equal(t, q(`SELECT sum(amount)::bigint FROM `+orders), q(`SELECT coalesce(sum(amount), 0)::bigint FROM `+ledger), "ledger sum equals orders sum")
	for _, k := range kinds {
		require.GreaterOrEqual(t, report.Faults[k], cdcMinimum[k], "fault %s injected often enough", k)
	}
	return report
}
