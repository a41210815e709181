package oncetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// SeedEnv names the environment variable that replays a run: the seed printed with a failure.
const SeedEnv = "ONCETEST_SEED"

// Config says what to test: the handler's events, how to read its effect and how to clear it.
type Config struct {
	// DB reaches the PostgreSQL the handler writes to. Required.
	DB *sql.DB
	// Schema holds the library's tables (migrate applied). Required: the kit writes claims,
	// inbox and outbox rows there, each run under a consumer name of its own, and adds one
	// table of its own (oncetest_commit_fault) to kill connections during COMMIT.
	Schema string

	// Events returns the messages of one run, in the order their producer sent them. Every
	// run asks for them again; return the same UUIDs, payloads and metadata each time. Messages
	// of one entity (one ordering key) belong in the order the producer sent them: the kit
	// also delivers them out of order. Required.
	Events func() []*message.Message
	// Reset clears what the handler wrote (its rows, an in-memory counter) before each run,
	// so that each run starts from the same state. Required.
	Reset func(ctx context.Context, db *sql.DB) error
	// Effect reads the handler's effect after a run: a count, or a snapshot of its rows. The
	// kit compares it (reflect.DeepEqual) with the effect of one clean delivery of each event,
	// in order. Required.
	Effect func(ctx context.Context, db *sql.DB) (any, error)

	// Middleware adjusts the once.Config of every run to the application's own (Key,
	// TxOptions, MaxMessageAge...). The kit sets Schema, Consumer, OutputTopic and, per mode,
	// GroupCommit and ShutdownGrace after it.
	Middleware func(*once.Config)

	// Modes to run. Default AllModes.
	Modes []Mode
	// Faults to inject. Default AllFaults.
	Faults []Fault

	// Seed fixes the schedules (which event a fault hits, the order of reordered events). Default:
	// ONCETEST_SEED, else the clock; the seed is printed with any violation.
	Seed uint64
}

// Kit drives one handler through the library's middleware under adversarial deliveries. Create
// it with New; Check runs it.
type Kit struct {
	cfg       Config
	seed      uint64
	publisher *RouterPublisher
	runs      atomic.Int64
	setupOnce sync.Once
	setupErr  error

	outputsMu sync.Mutex
	outputs   map[string]int // the reference's outputs per set of events (see wantOutputs)
}

// New returns a kit for cfg. It fails t when cfg is incomplete.
func New(t testing.TB, cfg Config) *Kit {
	t.Helper()
	if err := cfg.validate(); err != nil {
		t.Fatalf("oncetest: invalid config: %v", err)
	}
	if len(cfg.Modes) == 0 {
		cfg.Modes = AllModes
	}
	if len(cfg.Faults) == 0 {
		cfg.Faults = AllFaults
	}
	seed := cfg.Seed
	if seed == 0 {
		if s := os.Getenv(SeedEnv); s != "" {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("oncetest: %s=%q is not a seed (an unsigned integer): %v", SeedEnv, s, err)
			}
			seed = v
		} else {
			seed = uint64(time.Now().UnixNano())
		}
	}
	return &Kit{cfg: cfg, seed: seed, publisher: &RouterPublisher{}}
}

func (c Config) validate() error {
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("DB is required: the database the handler writes to"))
	}
	if err := pgtx.ValidateIdentifier("Schema", c.Schema); err != nil {
		errs = append(errs, fmt.Errorf("%w (the schema migrate applied the library's tables to)", err))
	}
	if c.Events == nil {
		errs = append(errs, errors.New("Events is required: the messages of one run"))
	}
	if c.Reset == nil {
		errs = append(errs, errors.New("Reset is required: it clears the handler's effect between runs"))
	}
	if c.Effect == nil {
		errs = append(errs, errors.New("Effect is required: it reads the handler's effect (a count or a snapshot)"))
	}
	if c.Middleware != nil {
		// Every mode's transaction writes: refuse options that fail every message here, not
		// as a violation report in each mode.
		var mc once.Config
		c.Middleware(&mc)
		if err := pgtx.CheckTxOptions("Middleware's TxOptions", mc.TxOptions); err != nil {
			errs = append(errs, err)
		}
	}
	for _, m := range c.Modes {
		if !m.valid() {
			errs = append(errs, fmt.Errorf("unknown mode %q", string(m)))
		}
	}
	for _, f := range c.Faults {
		if !f.valid() {
			errs = append(errs, fmt.Errorf("unknown fault %q", string(f)))
		}
	}
	return errors.Join(errs...)
}

// Seed is the seed of this kit's schedules.
func (k *Kit) Seed() uint64 { return k.seed }

// Publisher stands for the router's publisher. Give it to a handler that takes a publisher:
// every message published on it during a delivery is a violation (a handler must return its
// output, which the middleware stores in the outbox in the transaction).
func (k *Kit) Publisher() *RouterPublisher { return k.publisher }

// Check runs h in every mode under every fault and reports each violation on t with t.Errorf:
// the mode, the smallest schedule that shows it (which delivery, which fault), the effect seen
// and the effect expected, and the seed that replays it. It returns the violations.
func (k *Kit) Check(t testing.TB, h message.HandlerFunc) []Violation {
	t.Helper()
	ctx := context.Background()
	k.setupOnce.Do(func() { k.setupErr = installCommitFault(ctx, k.cfg.DB, k.cfg.Schema) })
	if k.setupErr != nil {
		t.Fatalf("oncetest: %v", k.setupErr)
	}
	events := k.cfg.Events()
	if len(events) == 0 {
		t.Fatalf("oncetest: Events returned no message")
	}

	// The reference: each event delivered once, in order, in a transaction of its own.
	want, vs, err := k.reference(ctx, h, allIndexes(len(events)))
	if err != nil {
		t.Fatalf("oncetest: %v", err)
	}
	if len(vs) == 0 {
		for _, mode := range k.cfg.Modes {
			for _, f := range k.cfg.Faults {
				if !f.appliesTo(mode, len(events)) {
					continue
				}
				if v, ok, err := k.checkOne(ctx, h, mode, f, want); err != nil {
					t.Fatalf("oncetest: %s, %s: %v", mode, f, err)
				} else if ok {
					vs = append(vs, v)
				}
			}
		}
	}
	for _, v := range vs {
		t.Errorf("%s\n    replay: %s=%d go test -run '%s'", v, SeedEnv, k.seed, t.Name())
	}
	return vs
}

// reference runs the events at idx once each, in order, in the own-transaction mode, and
// returns their effect. A delivery that fails there is a violation already.
func (k *Kit) reference(ctx context.Context, h message.HandlerFunc, idx []int) (any, []Violation, error) {
	s := schedule{fault: FaultNone, order: idx, copies: 1, target: -1}
	res, err := k.run(ctx, h, ModeOwnTx, s)
	if err != nil {
		return nil, nil, err
	}
	var vs []Violation
	if res.endedTx != nil || res.refused != nil || res.published > 0 || res.failed != nil {
		vs = append(vs, k.violation(ModeOwnTx, s, res, res.effect, "a clean delivery of each event, once, in order"))
	}
	return res.effect, vs, nil
}

// checkOne runs fault f in mode on every event, then, if that shows a violation and the fault
// targets one event, on that event alone: the smaller schedule is reported when it still fails.
func (k *Kit) checkOne(ctx context.Context, h message.HandlerFunc, mode Mode, f Fault, want any) (Violation, bool, error) {
	n := len(k.cfg.Events())
	s := k.newSchedule(f, n)
	v, ok, err := k.runAndCompare(ctx, h, mode, s, want)
	if err != nil || !ok || s.target < 0 || n == 1 {
		return v, ok, err
	}
	small := s
	small.order = []int{s.target}
	smallWant, refVs, err := k.reference(ctx, h, small.order)
	if err != nil || len(refVs) > 0 {
		return v, ok, err
	}
	if sv, sok, err := k.runAndCompare(ctx, h, mode, small, smallWant); err == nil && sok {
		return sv, true, nil
	}
	return v, ok, nil
}

func (k *Kit) runAndCompare(ctx context.Context, h message.HandlerFunc, mode Mode, s schedule, want any) (Violation, bool, error) {
	res, err := k.run(ctx, h, mode, s)
	if err != nil {
		return Violation{}, false, err
	}
	bad := res.endedTx != nil || res.refused != nil || res.published > 0 || res.failed != nil ||
		!reflect.DeepEqual(res.effect, want) || res.outputs != res.wantOutputs
	if !bad {
		return Violation{}, false, nil
	}
	return k.violation(mode, s, res, want, "one clean delivery of each event, in order"), true, nil
}

// Violation is one schedule under which the handler's effect was not applied exactly once.
type Violation struct {
	Mode     Mode
	Fault    Fault
	Schedule string // the deliveries and the fault, in words
	Seen     string // what the kit saw
	Want     string // what one clean delivery of each event gives
	Hint     string // what such a result usually means in handler code
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "oncetest: %s, %s: the handler's effect was not applied exactly once\n", v.Mode, v.Fault)
	fmt.Fprintf(&b, "    schedule: %s\n", v.Schedule)
	fmt.Fprintf(&b, "    seen:     %s\n", v.Seen)
	if v.Want != "" {
		fmt.Fprintf(&b, "    want:     %s\n", v.Want)
	}
	fmt.Fprintf(&b, "    likely:   %s", v.Hint)
	return b.String()
}

func (k *Kit) violation(mode Mode, s schedule, res runResult, want any, wantWhat string) Violation {
	v := Violation{Mode: mode, Fault: s.fault, Schedule: s.describe(res.events)}
	switch {
	case res.endedTx != nil:
		v.Seen = fmt.Sprintf("the middleware refused the delivery: %v", res.endedTx)
		v.Hint = "the handler commits or rolls back the transaction it was lent (pgtx.TxFromContext): leave it open; the middleware commits it after the claim and the outbox rows are written"
	case res.published > 0:
		v.Seen = fmt.Sprintf("%d message(s) published on the router's publisher during the deliveries", res.published)
		v.Hint = "the handler publishes its output with the router's publisher instead of returning it: a published message leaves before the commit, so a rolled-back attempt or a redelivery publishes it again; return it from the handler and the middleware stores it in the outbox, in the transaction"
	case res.refused != nil:
		v.Seen = fmt.Sprintf("a delivery failed permanently (a real router parks it, unapplied): %v", res.refused)
		v.Hint = "the handler returned a permanent error (or panicked) for an event that applies cleanly once: under this fault it should have succeeded"
	case res.failed != nil:
		v.Seen = fmt.Sprintf("a delivery never succeeded after %d redeliveries: %v", maxRedeliveries, res.failed)
		v.Hint = "the handler fails on a redelivery of an event it applied cleanly once"
	case res.outputs != res.wantOutputs:
		v.Seen = fmt.Sprintf("%d output message(s) stored in the outbox", res.outputs)
		v.Want = fmt.Sprintf("%d (one set per event)", res.wantOutputs)
		v.Hint = "the handler's returned messages depend on something outside the transaction"
	default:
		v.Seen = fmt.Sprintf("effect %v", res.effect)
		v.Want = fmt.Sprintf("effect %v (%s)", want, wantWhat)
		v.Hint = s.fault.hint()
	}
	if v.Want == "" && res.effect != nil {
		v.Seen += fmt.Sprintf("; effect %v", res.effect)
	}
	return v
}

func allIndexes(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// RouterPublisher stands for the router's publisher (see Kit.Publisher). It counts what it is
// given and delivers it nowhere.
type RouterPublisher struct{ n atomic.Int64 }

// Publish counts msgs.
func (p *RouterPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return nil
}

// Close does nothing.
func (p *RouterPublisher) Close() error { return nil }

var _ message.Publisher = (*RouterPublisher)(nil)
