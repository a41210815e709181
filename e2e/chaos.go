package e2e

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e/internal/scenario"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Fault kinds of the chaos mode, as they appear in its report.
const (
	FaultConsumerKill    = "consumer_kill"     // SIGKILL of a consumer process, then a restart
	FaultRelayKill       = "relay_kill"        // SIGKILL of the relay process (by the nemesis or by itself right after a publish), then a restart
	FaultPGRestart       = "pg_restart"        // PostgreSQL stopped in immediate mode (a crash: recovery replays the WAL) and started
	FaultPGTerminate     = "pg_terminate"      // pg_terminate_backend of every application connection
	FaultBrokerRestart   = "broker_restart"    // the broker node killed or stopped, then started
	FaultBrokerConnClose = "broker_conn_close" // the broker closes every client connection
)

// ChaosTarget is one broker under the chaos mode.
type ChaosTarget struct {
	Name   string
	Config func(t *testing.T, schema string) broker.Config
	// RestartBroker stops the broker node hard and starts it again, returning when it serves.
	// Nil for the SQL broker, whose broker is PostgreSQL (its pg_restart is the broker restart).
	RestartBroker func(ctx context.Context) error
	// BreakConnections makes the broker drop every client connection of cfg. Optional.
	BreakConnections func(t *testing.T, cfg broker.Config) (int, error)
	// CrashPostgres stops PostgreSQL in immediate mode and starts it again. Required.
	CrashPostgres func(ctx context.Context) error
}

// Defaults of ChaosOptions (Pace: DefaultPace).
const (
	DefaultChaosEvents    = 3000
	DefaultChaosProducers = 3
	DefaultChaosMinGap    = 500 * time.Millisecond
	DefaultChaosMaxGap    = 2 * time.Second
	DefaultRelaySelfKill  = 0.25
	DefaultChaosTimeout   = 10 * time.Minute
)

// ChaosOptions sizes a chaos run.
type ChaosOptions struct {
	// Binaries of e2e/internal/consumer, relay and producer. Required.
	ConsumerBinary, RelayBinary, ProducerBinary string
	// Events the producer processes commit (one poison event is added). Default
	// DefaultChaosEvents (3000).
	Events int
	// Producers is the number of producer processes. Default DefaultChaosProducers (3).
	Producers int
	// Pace is each producer's pause between events. Default DefaultPace (40ms).
	Pace time.Duration
	// Seed makes the nemesis's choices reproducible; 0 picks one (printed in the report).
	Seed uint64
	// Gap bounds the nemesis's pause after the stream recovered from one fault. Default
	// DefaultChaosMinGap..DefaultChaosMaxGap (500ms..2s).
	MinGap, MaxGap time.Duration
	// RelaySelfKill is the probability that the relay kills itself right after a publish,
	// before its position update. Default DefaultRelaySelfKill (0.25): with 0.15, ci-size
	// passes republished 12.6% to 32.5% of the events, too close to the 10% every pass must
	// reach.
	RelaySelfKill float64
	// Timeout bounds the run. Default DefaultChaosTimeout (10 minutes).
	Timeout time.Duration
}

func (o *ChaosOptions) setDefaults() {
	o.Events = cmp.Or(o.Events, DefaultChaosEvents)
	o.Producers = cmp.Or(o.Producers, DefaultChaosProducers)
	o.Pace = cmp.Or(o.Pace, DefaultPace)
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	o.MinGap = cmp.Or(o.MinGap, DefaultChaosMinGap)
	o.MaxGap = cmp.Or(o.MaxGap, DefaultChaosMaxGap)
	o.RelaySelfKill = cmp.Or(o.RelaySelfKill, DefaultRelaySelfKill)
	o.Timeout = cmp.Or(o.Timeout, DefaultChaosTimeout)
}

// ChaosReport is the one-line JSON summary of a chaos run (printed as "e2e chaos report: {json}").
type ChaosReport struct {
	Broker             string         `json:"broker"`
	Seed               uint64         `json:"seed"`
	Events             int            `json:"events"`
	Published          int            `json:"published"`
	RepublishedPct     float64        `json:"republished_pct"`
	Deliveries         uint64         `json:"deliveries"`
	DuplicatesAbsorbed uint64         `json:"duplicates_absorbed"`
	Lost               int            `json:"lost"`
	AppliedTwice       int            `json:"applied_twice"`
	PoisonParked       bool           `json:"poison_parked"`
	AppliedByBatch     int            `json:"applied_by_batch"` // ledger rows of consumer b, whose handler is a batch handler
	Faults             map[string]int `json:"faults"`
	RecoveryMsP50      int64          `json:"recovery_ms_p50"`
	RecoveryMsMax      int64          `json:"recovery_ms_max"`
	DurationS          float64        `json:"duration_s"`
}

// chaosMinimum is how often each fault must hit a run; the nemesis injects these first, in an
// order of its seeded choosing, then picks at random among every fault the target supports.
var chaosMinimum = map[string]int{
	FaultConsumerKill: 3, FaultRelayKill: 2, FaultPGRestart: 1, FaultPGTerminate: 1,
	FaultBrokerRestart: 1, FaultBrokerConnClose: 1,
}

// chaosMinRepublishedPct is the share of events a run must have published more than once
// (relay kills between a publish and its position update), so the consumers' dedupe is tested.
const chaosMinRepublishedPct = 10.0

// RunChaos is the chaos mode of the fault suite: producers, the relay and two consumer
// instances (b with a batch handler, as in Run) run as separate OS processes, and a seeded nemesis keeps injecting faults at random
// intervals for the whole run: SIGKILL of a consumer or of the relay (also right between a
// publish and the position update), an immediate-mode PostgreSQL restart, pg_terminate_backend
// of every application connection, a broker restart and a broker connection close. It ends
// with the checks of Run (count and sum, one claim per applied event, the poison parked, nothing
// lost, nothing applied twice) and logs one "e2e chaos report: {json}" line.
//
// It restarts PostgreSQL: nothing else may use the server while it runs.
func RunChaos(t *testing.T, target ChaosTarget, opts ChaosOptions) ChaosReport {
	opts.setDefaults()
	require.NotEmpty(t, opts.ConsumerBinary)
	require.NotEmpty(t, opts.RelayBinary)
	require.NotEmpty(t, opts.ProducerBinary)
	require.NotNil(t, target.CrashPostgres, "ChaosTarget.CrashPostgres")
	t.Logf("e2e chaos[%s]: seed %d (E2E_CHAOS_SEED=%d reproduces the nemesis's choices)", target.Name, opts.Seed, opts.Seed)
	rng := rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15))
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()

	// The control pool survives PostgreSQL restarts by retrying (see ctl); the application
	// processes carry an application_name that pg_terminate targets.
	control := pgtest.OpenDB(t, 4)
	schema := pgtest.Schema(t, control)
	require.NoError(t, scenario.CreateTables(ctx, control, schema))
	appName := pgtest.NewName("chaos_app")
	appURL := withApplicationName(t, pgtest.URL(), appName)
	topic, poisonTopic, group := pgtest.NewName("orders"), pgtest.NewName("parked"), "ledger"
	cfg := target.Config(t, schema)
	cfg.DatabaseURL = appURL
	cfg.Subscriptions = []broker.Subscription{{Topic: topic, Group: group}, {Topic: poisonTopic, Group: "ops"}}
	// Creates the topics (Kafka) and queues (RabbitMQ) before any process uses them.
	b, err := broker.New(ctx, control, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.Declare(ctx, cfg.Subscriptions...))
	brokertest.DeleteCreatedKafkaTopics(t, b) // a long-lived broker recovers every topic at each restart

	logDir := t.TempDir()
	if d := os.Getenv("E2E_LOG_DIR"); d != "" {
		logDir = filepath.Join(d, "chaos-"+target.Name+"-"+appName)
		require.NoError(t, os.MkdirAll(logDir, 0o755))
		t.Logf("process logs in %s", logDir)
	}
	env := append(cfg.Environ(), scenario.EnvSchema+"="+schema, scenario.EnvTopic+"="+topic,
		scenario.EnvPoisonTopic+"="+poisonTopic, scenario.EnvGroup+"="+group)

	var pubMu sync.Mutex
	publishes := map[string]int{}
	relays := &fleet{t: t, bin: opts.RelayBinary, dir: logDir,
		env: append(slices.Clone(env), fmt.Sprintf("%s=%g", scenario.EnvRelaySelfKill, opts.RelaySelfKill)),
		onLine: func(line string) bool {
			ids, ok := strings.CutPrefix(line, scenario.PublishedPrefix)
			if ok {
				pubMu.Lock()
				for _, id := range strings.Split(ids, ",") {
					publishes[id]++
				}
				pubMu.Unlock()
			}
			return ok
		}}
	consumers := &fleet{t: t, bin: opts.ConsumerBinary, dir: logDir, env: env, envOf: batchConsumer}
	faults := &chaosFaults{counts: map[string]int{}}
	relay := superviseProc(t, relays, "relay", func(selfKilled bool) {
		if selfKilled {
			faults.add(FaultRelayKill, "the relay killed itself right after a publish, before its position update")
		}
	})
	consumerA := superviseProc(t, consumers, "a", nil)
	consumerB := superviseProc(t, consumers, "b", nil)
	t.Cleanup(func() {
		relay.shutdown()
		consumerA.shutdown()
		consumerB.shutdown()
		relays.killAll()
		consumers.killAll()
	})

	// Producer processes, each a range of event numbers.
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

	// The nemesis.
	kinds := []string{FaultConsumerKill, FaultRelayKill, FaultPGRestart, FaultPGTerminate}
	if target.RestartBroker != nil {
		kinds = append(kinds, FaultBrokerRestart)
	}
	if target.BreakConnections != nil {
		kinds = append(kinds, FaultBrokerConnClose)
	}
	inject := func(kind string) {
		switch kind {
		case FaultConsumerKill:
			c := consumerA
			if rng.IntN(2) == 1 {
				c = consumerB
			}
			faults.add(kind, "SIGKILL consumer "+c.name)
			c.kill()
		case FaultRelayKill:
			faults.add(kind, "SIGKILL relay")
			relay.kill()
		case FaultPGRestart:
			faults.add(kind, "PostgreSQL immediate-mode restart")
			require.NoError(t, target.CrashPostgres(ctx))
			if target.RestartBroker == nil { // the SQL broker's node is PostgreSQL
				faults.count(FaultBrokerRestart)
			}
		case FaultPGTerminate:
			var n int
			require.NoError(t, ctlQueryRow(ctx, control, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) x`, []any{appName}, &n))
			faults.add(kind, fmt.Sprintf("pg_terminate_backend of %d application connections", n))
		case FaultBrokerRestart:
			faults.add(kind, "broker node restart")
			require.NoError(t, target.RestartBroker(ctx))
		case FaultBrokerConnClose:
			n, err := target.BreakConnections(t, cfg)
			require.NoError(t, err)
			faults.add(kind, fmt.Sprintf("broker closed %d client connections", n))
		}
	}
	poisonID := "poison-" + pgtest.NewName("p")
	poisonSent := false
	var recoveries []time.Duration
	for {
		minimaMet := true
		var unmet []string
		for _, k := range kinds {
			if faults.get(k) < chaosMinimum[k] {
				unmet = append(unmet, k)
				minimaMet = false
			}
		}
		// The poison event goes out once a third of the events are applied: keep the nemesis
		// going until it has, however quickly the producers finished (on Kafka a broker restart
		// can hold the consumers back past the producers' end).
		if minimaMet && producersDone() && poisonSent {
			break
		}
		require.NoError(t, ctx.Err(), "chaos run timed out; faults so far: %v", faults.counts)
		gap := opts.MinGap + time.Duration(rng.Int64N(int64(opts.MaxGap-opts.MinGap)+1))
		time.Sleep(gap) // the nemesis's random interval is the point here, not a wait for a condition

		if !poisonSent && applied() > total/3 {
			w, err := outbox.NewWriter(outbox.Config{Schema: schema, ValidateTopic: broker.TopicValidator(cfg.Kind)})
			require.NoError(t, err)
			require.NoError(t, scenario.ProduceUntil(ctx, control, w, schema, topic, scenario.Event{OrderID: poisonID, Amount: 999_999, Poison: true}, "customer-0", time.Minute))
			poisonSent = true
		}
		kind := kinds[rng.IntN(len(kinds))]
		if len(unmet) > 0 {
			kind = unmet[rng.IntN(len(unmet))]
		}
		before, at := applied(), time.Now()
		inject(kind)
		// Recovery: the time until the ledger grows again, if there is anything left to apply.
		if before < total {
			waitFor(t, ctx, 3*time.Minute, func() bool { return applied() > before }, func() string {
				return fmt.Sprintf("no progress after %s (faults %v); logs: %s%s", kind, faults.counts, consumers.logTails(), relays.logTails())
			})
			recoveries = append(recoveries, time.Since(at))
			faults.note(fmt.Sprintf("progress resumed %s after %s", time.Since(at).Round(time.Millisecond), kind))
		}
	}
	require.True(t, poisonSent, "the run was too short to send the poison event")
	for _, p := range producerProcs {
		require.True(t, p.cmd.ProcessState.Success(), "producer %s exited with %v; log:\n%s", p.name, p.cmd.ProcessState, tail(p.logPath))
	}

	// Everything arrives, then the stream stays quiet long enough for any late copy to land.
	waitFor(t, ctx, opts.Timeout, func() bool { return applied() >= total }, func() string {
		return fmt.Sprintf("every event applied (%d of %d); logs: %s%s", applied(), total, consumers.logTails(), relays.logTails())
	})
	quietSince, last := time.Now(), consumers.deliveries()
	waitFor(t, ctx, time.Minute, func() bool {
		if d := consumers.deliveries(); d != last {
			last, quietSince = d, time.Now()
		}
		return time.Since(quietSince) > 2*time.Second
	}, func() string { return "the consumers kept receiving copies" })
	relay.stop()
	consumerA.stop()
	consumerB.stop()

	rows, distinct := q(`SELECT count(*) FROM `+ledger), q(`SELECT count(DISTINCT event_id) FROM `+ledger)
	lost := q(`SELECT count(*) FROM `+orders+` o WHERE id <> $1 AND NOT EXISTS (SELECT 1 FROM `+ledger+` l WHERE l.order_id = o.id)`, poisonID)
	poisonUUID := "evt-" + poisonID
	outboxTable := pgtx.QualifiedName(schema, "outbox")
	parkedPoison := q(`SELECT count(*) FROM `+outboxTable+` WHERE payload->>'destination_topic' = $1 AND uuid = $2`, poisonTopic, poisonUUID)
	pubMu.Lock()
	published, republished := 0, 0
	for _, n := range publishes {
		published += n
		if n > 1 {
			republished++
		}
	}
	pubMu.Unlock()
	st := consumers.totals()
	report := ChaosReport{
		Broker: target.Name, Seed: opts.Seed, Events: total, Published: published,
		RepublishedPct: float64(int(1000*float64(republished)/float64(total+1))) / 10,
		Deliveries:     st.Deliveries, DuplicatesAbsorbed: st.Duplicates,
		Lost: lost, AppliedTwice: rows - distinct, PoisonParked: parkedPoison >= 1,
		AppliedByBatch: q(`SELECT count(*) FROM ` + ledger + ` WHERE instance = 'b'`),
		Faults:         faults.snapshot(), DurationS: time.Since(began).Round(100 * time.Millisecond).Seconds(),
	}
	report.RecoveryMsP50, report.RecoveryMsMax = percentiles(recoveries)
	line, _ := json.Marshal(report)
	for _, f := range faults.list() {
		t.Logf("e2e chaos[%s] fault: %s", target.Name, f)
	}
	t.Logf("e2e chaos report: %s", line)

	require.Equal(t, total, q(`SELECT count(*) FROM `+orders+` WHERE id <> $1`, poisonID), "every producer transaction committed once")
	require.Zero(t, lost, "nothing lost")
	require.Zero(t, report.AppliedTwice, "nothing applied twice")
	require.Equal(t, total, rows, "one ledger row per produced event")
	require.Equal(t, q(`SELECT sum(amount)::bigint FROM `+orders+` WHERE id <> $1`, poisonID), q(`SELECT coalesce(sum(amount), 0)::bigint FROM `+ledger), "ledger sum equals orders sum")
	require.Equal(t, total, q(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")+` WHERE consumer = $1 AND message_id NOT LIKE 'wmonce-retry/%'`, group), "one dedupe claim per applied event")
	require.Positive(t, q(`SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")+` WHERE consumer = $1 AND message_id LIKE 'wmonce-retry/%'`, group), "events that needed time went through delayed retries")
	require.Zero(t, q(`SELECT count(*) FROM `+ledger+` WHERE event_id = $1`, poisonUUID), "poison not applied")
	require.True(t, report.PoisonParked, "the poison event is parked")
	for _, k := range kinds {
		require.GreaterOrEqual(t, report.Faults[k], chaosMinimum[k], "fault %s injected often enough", k)
	}
	// The SQL broker's node is PostgreSQL: its crash-restarts count as broker restarts there.
	require.GreaterOrEqual(t, report.Faults[FaultBrokerRestart], chaosMinimum[FaultBrokerRestart], "the broker restarted at least once")
	require.GreaterOrEqual(t, report.RepublishedPct, chaosMinRepublishedPct, "at least %g%% of the events published more than once", chaosMinRepublishedPct)
	return report
}

// supervised is one process slot (a consumer or the relay) that a supervisor keeps running:
// whatever kills the process, it is started again, as a deployment's supervisor would.
type supervised struct {
	t      *testing.T
	f      *fleet
	name   string
	onExit func(selfKilled bool)

	mu       sync.Mutex
	cur      *proc
	killing  bool // the nemesis sent this SIGKILL
	stopping bool
	exited   chan struct{}
}

func superviseProc(t *testing.T, f *fleet, name string, onExit func(selfKilled bool)) *supervised {
	s := &supervised{t: t, f: f, name: name, onExit: onExit, cur: f.start(name), exited: make(chan struct{})}
	go s.loop()
	return s
}

func (s *supervised) loop() {
	defer close(s.exited)
	for {
		s.mu.Lock()
		p := s.cur
		s.mu.Unlock()
		<-p.done
		s.f.retire(p)
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		byNemesis := s.killing
		s.killing = false
		s.mu.Unlock()
		if !byNemesis && s.onExit != nil {
			ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
			s.onExit(ws.Signaled() && ws.Signal() == syscall.SIGKILL)
		}
		next := s.f.start(s.name)
		s.mu.Lock()
		s.cur = next
		s.mu.Unlock()
	}
}

// kill sends SIGKILL; the supervisor restarts the process.
func (s *supervised) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killing = true
	_ = s.cur.cmd.Process.Signal(syscall.SIGKILL)
}

// stop ends the slot with a clean SIGTERM and checks the exit.
func (s *supervised) stop() {
	s.mu.Lock()
	s.stopping = true
	p := s.cur
	s.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-s.exited
		s.t.Errorf("%s did not stop within 30s of SIGTERM", s.name)
	}
	require.True(s.t, p.cmd.ProcessState.Success(), "%s exited with %v; log:\n%s", s.name, p.cmd.ProcessState, tail(p.logPath))
}

// shutdown stops supervising without checks (test cleanup).
func (s *supervised) shutdown() {
	s.mu.Lock()
	s.stopping = true
	p := s.cur
	s.mu.Unlock()
	_ = p.cmd.Process.Kill()
	<-s.exited
}

type chaosFaults struct {
	mu     sync.Mutex
	counts map[string]int
	log    []string
}

func (c *chaosFaults) add(kind, what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[kind]++
	c.log = append(c.log, time.Now().Format("15:04:05.000")+" "+kind+": "+what)
}

// note adds a line to the fault log without counting a fault.
func (c *chaosFaults) note(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log = append(c.log, time.Now().Format("15:04:05.000")+" "+what)
}

func (c *chaosFaults) count(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[kind]++
}

func (c *chaosFaults) get(kind string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[kind]
}

func (c *chaosFaults) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.log)
}

// snapshot returns every fault kind of the report, zero where none was injected.
func (c *chaosFaults) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, k := range []string{FaultConsumerKill, FaultRelayKill, FaultPGRestart, FaultPGTerminate, FaultBrokerRestart, FaultBrokerConnClose} {
		out[k] = c.counts[k]
	}
	return out
}

func percentiles(ds []time.Duration) (p50, max int64) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2].Milliseconds(), s[len(s)-1].Milliseconds()
}

// ctlQueryRow runs a control query, retrying while PostgreSQL restarts.
func ctlQueryRow(ctx context.Context, db *sql.DB, query string, args []any, dest ...any) error {
	var err error
	for range 300 {
		if err = db.QueryRowContext(ctx, query, args...).Scan(dest...); err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond) // the server is restarting: ask again
	}
	return err
}

func ctlCount(ctx context.Context, t *testing.T, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, ctlQueryRow(ctx, db, query, args, &n), query)
	return n
}

// waitFor polls cond every 20ms until it holds, failing with why() after limit.
func waitFor(t *testing.T, ctx context.Context, limit time.Duration, cond func() bool, why func() string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("waited %s: %s", limit, why())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ServicesScript runs the project's provisioning script (e2e/services) with args, from a
// test whose working directory is a package directory of this module. The e2e module's root
// is the e2e folder itself, which holds the script.
func ServicesScript(ctx context.Context, args ...string) error {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("find the module root: %w", err)
	}
	script := filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), "services")
	out, err := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("e2e/services %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
