package oncetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// seedEnv names the environment variable that replays a run: the seed printed with a failure
// (the package doc names it).
const seedEnv = "ONCETEST_SEED"

// Config says what to test: the handler's events, how to read its effect and how to clear it.
type Config struct {
	// DB reaches the PostgreSQL the handler writes to. Required.
	DB *sql.DB
	// Schema holds the library's tables (migrate applied); the kit adds its table
	// oncetest_commit_fault there. Required.
	Schema string

	// Events returns the messages of one run in their producer's order, the same ones (UUIDs,
	// payloads, metadata) at every call. Required.
	Events func() []*message.Message
	// Reset clears all the handler wrote (rows, an in-memory counter) before each run. Required.
	Reset func(ctx context.Context, db *sql.DB) error
	// Effect reads the handler's committed effect after a run (a count, a snapshot of rows),
	// compared with one clean delivery's. Required.
	Effect func(ctx context.Context, db *sql.DB) (any, error)

	// Middleware adjusts every run's once.Config (Key, TxOptions, ...); the kit then sets
	// Schema, Consumer, OutputTopic, GroupCommit and ShutdownGrace.
	Middleware func(*once.Config)

	// Modes to run. Default AllModes.
	Modes []Mode
	// Faults to inject. Default AllFaults.
	Faults []Fault

	// Seed fixes the schedules. Default: ONCETEST_SEED, else the clock.
	Seed uint64
}

// Kit drives one handler through the library's middleware under adversarial deliveries. Create
// it with New; Check runs it.
type Kit struct {
	cfg       Config
	seed      uint64
	publisher *routerPublisher
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
	seed, err := seedFor(cfg.Seed)
	if err != nil {
		t.Fatalf("oncetest: %v", err)
	}
	return &Kit{cfg: cfg, seed: seed, publisher: &routerPublisher{}}
}

// seedFor is the seed of a kit: Config.Seed, else ONCETEST_SEED, else the clock.
func seedFor(seed uint64) (uint64, error) {
	s := os.Getenv(seedEnv)
	switch {
	case seed != 0:
		return seed, nil
	case s == "":
		return uint64(time.Now().UnixNano()), nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not a seed (an unsigned integer): %w", seedEnv, s, err)
	}
	return v, nil
}

func (c Config) validate() error {
	required := []struct {
		missing bool
		err     string
	}{
		{c.DB == nil, "DB is required: the database the handler writes to"},
		{c.Events == nil, "Events is required: the messages of one run"},
		{c.Reset == nil, "Reset is required: it clears the handler's effect between runs"},
		{c.Effect == nil, "Effect is required: it reads the handler's effect (a count or a snapshot)"},
	}
	var errs []error
	for _, r := range required {
		if r.missing {
			errs = append(errs, errors.New(r.err))
		}
	}
	if err := pgtx.ValidateIdentifier("Schema", c.Schema); err != nil {
		errs = append(errs, fmt.Errorf("%w (the schema migrate applied the library's tables to)", err))
	}
	errs = append(errs, checkMiddleware(c.Middleware))
	errs = append(errs, unknown("mode", c.Modes)...)
	errs = append(errs, unknown("fault", c.Faults)...)
	return errors.Join(errs...)
}

// checkMiddleware refuses TxOptions that fail every message: every mode's transaction writes,
// so say it here, not as a violation report in each mode.
func checkMiddleware(adjust func(*once.Config)) error {
	if adjust == nil {
		return nil
	}
	var mc once.Config
	adjust(&mc)
	return pgtx.CheckTxOptions("Middleware's TxOptions", mc.TxOptions)
}

// unknown names each of vs (modes or faults) that the kit does not know.
func unknown[T interface {
	~string
	valid() bool
}](what string, vs []T) []error {
	var errs []error
	for _, v := range vs {
		if !v.valid() {
			errs = append(errs, fmt.Errorf("unknown %s %q", what, string(v)))
		}
	}
	return errs
}

// Seed is the seed of this kit's schedules.
func (k *Kit) Seed() uint64 { return k.seed }

// Publisher stands for the router's publisher: a message a handler publishes on it during a
// delivery is a violation (outputs are returned, to go into the outbox in the transaction).
func (k *Kit) Publisher() message.Publisher { return k.publisher }

// Check runs h in every mode under every fault, reports each violation on t with t.Errorf (see
// the package doc) and returns them.
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
	ref, vs, err := k.reference(ctx, h, allIndexes(len(events)))
	if err != nil {
		t.Fatalf("oncetest: %v", err)
	}
	logRefused(t, events, ref)
	if len(vs) == 0 {
		vs = k.checkModes(ctx, t, h, ref, len(events))
	}
	for _, v := range vs {
		t.Errorf("%s\n    replay: %s=%d go test -run '%s'", v, seedEnv, k.seed, t.Name())
	}
	return vs
}

// logRefused says which events the clean delivery refused: they are expected refused under
// every fault too.
func logRefused(t testing.TB, events []*message.Message, ref expected) {
	t.Helper()
	for _, e := range sortedKeys(ref.refused) {
		t.Logf("oncetest: event %d (uuid %s) is refused on a clean delivery (%v); the kit expects it refused under every fault too", e+1, events[e].UUID, ref.refused[e])
	}
}

// checkModes runs every fault that applies in every mode against ref and returns the
// violations; a schedule the kit could not run is reported on t, and the others still run.
func (k *Kit) checkModes(ctx context.Context, t testing.TB, h message.HandlerFunc, ref expected, n int) []Violation {
	t.Helper()
	var vs []Violation
	for _, mode := range k.cfg.Modes {
		for _, f := range k.cfg.Faults {
			if !f.appliesTo(mode, n) {
				continue
			}
			v, ok, err := k.checkOne(ctx, h, mode, f, ref)
			if err != nil {
				t.Errorf("oncetest: %s, %s: the kit could not run this schedule: %v", mode, f, err)
				continue
			}
			if ok {
				vs = append(vs, v)
			}
		}
	}
	return vs
}

// expected is what a clean delivery of some events gives: their effect, and the events the
// handler refuses permanently (wmonce.Permanent), which every other schedule must refuse too.
type expected struct {
	effect  any
	refused map[int]error
}

// reference runs the events at idx once each, in order, in the own-transaction mode, and
// returns their effect. A delivery that fails there (other than a permanent refusal, the
// documented way to refuse an event) is a violation already.
func (k *Kit) reference(ctx context.Context, h message.HandlerFunc, idx []int) (expected, []Violation, error) {
	s := schedule{fault: FaultNone, order: idx, copies: 1, target: -1}
	res, err := k.run(ctx, h, ModeOwnTx, s)
	if err != nil {
		return expected{}, nil, err
	}
	ref := expected{effect: res.effect, refused: res.refused}
	if res.misused() || slices.ContainsFunc(slices.Collect(maps.Values(res.refused)), wmonce.IsPanic) {
		return ref, []Violation{k.violation(ModeOwnTx, s, res, ref, true)}, nil
	}
	return ref, nil, nil
}

// misused says whether a run shows a violation whatever its effect: the handler ended its
// transaction, published on the router's publisher, acked its own message, or a copy never
// succeeded.
func (r runResult) misused() bool {
	return r.endedTx != nil || r.published > 0 || r.failed != nil || r.selfAck != ""
}

// checkOne runs fault f in mode on every event, then, if that shows a violation and the fault
// targets one event, on that event alone: the smaller schedule is reported when it still fails.
func (k *Kit) checkOne(ctx context.Context, h message.HandlerFunc, mode Mode, f Fault, want expected) (Violation, bool, error) {
	n := len(k.cfg.Events())
	s := k.newSchedule(f, n)
	v, ok, err := k.runAndCompare(ctx, h, mode, s, want)
	if err != nil || !ok || s.target < 0 || n == 1 {
		return v, ok, err
	}
	v, err = k.shrink(ctx, h, mode, s, v)
	return v, true, err
}

// shrink runs s on its target event alone and returns that smaller schedule's violation when it
// still shows one, else v.
func (k *Kit) shrink(ctx context.Context, h message.HandlerFunc, mode Mode, s schedule, v Violation) (Violation, error) {
	small := s
	small.order = []int{s.target}
	smallWant, refVs, err := k.reference(ctx, h, small.order)
	if err != nil || len(refVs) > 0 {
		return v, err
	}
	if sv, ok, err := k.runAndCompare(ctx, h, mode, small, smallWant); err == nil && ok {
		return sv, nil
	}
	return v, nil
}

func (k *Kit) runAndCompare(ctx context.Context, h message.HandlerFunc, mode Mode, s schedule, want expected) (Violation, bool, error) {
	res, err := k.run(ctx, h, mode, s)
	if err != nil {
		return Violation{}, false, err
	}
	if !res.misused() && res.matches(want) {
		return Violation{}, false, nil
	}
	return k.violation(mode, s, res, want, false), true, nil
}

// matches says whether a run gave what want says: the same refusals, effect and outputs.
func (r runResult) matches(want expected) bool {
	return sameEvents(r.refused, want.refused) && reflect.DeepEqual(r.effect, want.effect) && r.outputs == r.wantOutputs
}

// sameEvents says whether a and b name the same events.
func sameEvents(a, b map[int]error) bool {
	if len(a) != len(b) {
		return false
	}
	for e := range a {
		if _, ok := b[e]; !ok {
			return false
		}
	}
	return true
}

func sortedKeys(m map[int]error) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Violation is one schedule under which the handler's effect was not applied exactly once.
type Violation struct {
	Mode       Mode
	Fault      Fault
	Schedule   string // the deliveries and the fault, in words
	Seen       string // what the kit saw
	Want       string // what one clean delivery of each event gives, where it is not the effect
	Effect     string // the effect observed
	WantEffect string // the effect of one clean delivery of each event, in order
	LastError  string // the last error the handler returned (else the last failed delivery's), or "none"
	Hint       string // what such a result usually means in handler code, from what was seen
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "oncetest: %s, %s: the handler's effect was not applied exactly once\n", v.Mode, v.Fault)
	fmt.Fprintf(&b, "    schedule:   %s\n", v.Schedule)
	fmt.Fprintf(&b, "    seen:       %s\n", v.Seen)
	if v.Want != "" {
		fmt.Fprintf(&b, "    want:       %s\n", v.Want)
	}
	fmt.Fprintf(&b, "    effect:     %s\n", v.Effect)
	if v.WantEffect == noReference {
		fmt.Fprintf(&b, "    reference:  %s\n", v.WantEffect)
	} else {
		fmt.Fprintf(&b, "    reference:  %s (one clean delivery of each event, in order)\n", v.WantEffect)
	}
	fmt.Fprintf(&b, "    last error: %s\n", v.LastError)
	fmt.Fprintf(&b, "    likely:     %s", v.Hint)
	return b.String()
}

// noReference stands for the reference effect in a report on the clean delivery itself.
const noReference = "none: this is the clean delivery of each event, once, in order, and it went wrong"

// violation describes what res shows, its hint chosen by what was seen, most telling first:
// an early ack, an ended transaction, a publish (misuseFinding); a delivery that never
// succeeded, a refusal the reference did not make (deliveryFinding); then the effect and the
// outputs compared with the reference (effectFinding). inReference says res is the reference
// run itself.
func (k *Kit) violation(mode Mode, s schedule, res runResult, want expected, inReference bool) Violation {
	v := Violation{
		Mode: mode, Fault: s.fault, Schedule: s.describe(res.events),
		Effect: fmt.Sprint(res.effect), WantEffect: fmt.Sprint(want.effect), LastError: lastError(res),
	}
	if inReference {
		v.WantEffect = noReference
	}
	f, ok := misuseFinding(res)
	if !ok {
		f, ok = deliveryFinding(s, res, want, inReference)
	}
	if !ok {
		f = effectFinding(s, res, want)
	}
	v.Seen, v.Want, v.Hint = f.seen, f.want, f.hint
	return v
}

// A finding is what a violation reports it saw, what it wanted where that is not the
// reference effect, and what such a result usually means in handler code.
type finding struct{ seen, want, hint string }

// lastError is the last error the handler returned, else the last failed delivery's.
func lastError(res runResult) string {
	switch {
	case res.handlerErr != nil:
		return brief(res.handlerErr)
	case res.deliveryErr != nil:
		return "none from the handler; the last failed delivery: " + brief(res.deliveryErr)
	}
	return "none"
}

// misuseFinding reports a handler that did the library's part: acked its message, ended the
// transaction it was lent, or published on the router's publisher.
func misuseFinding(res runResult) (finding, bool) {
	switch {
	case res.selfAck != "":
		return finding{
			seen: fmt.Sprintf("the handler acked or nacked the message it was given (%s)", res.selfAck),
			hint: "an early ack: the ack belongs to the library, which acks only after the claim, the effect and the outbox rows commit; a handler's ack lets the broker forget a message whose effect may never commit (a rollback, a failed COMMIT, a crash), and a nack redelivers one that did. Remove msg.Ack() and msg.Nack() from the handler: return nil to have it acked after the commit, an error to have it delivered again, wmonce.Permanent to have it parked",
		}, true
	case res.endedTx != nil:
		return finding{
			seen: fmt.Sprintf("the middleware refused the delivery: %v", res.endedTx),
			hint: "the handler commits or rolls back the transaction it was lent (pgtx.TxFromContext): leave it open; the middleware commits it after the claim and the outbox rows are written",
		}, true
	case res.published > 0:
		return finding{
			seen: fmt.Sprintf("%d message(s) published on the router's publisher during the deliveries", res.published),
			hint: "the handler publishes its output with the router's publisher instead of returning it: a published message leaves before the commit, so a rolled-back attempt or a redelivery publishes it again; return it from the handler and the middleware stores it in the outbox, in the transaction",
		}, true
	}
	return finding{}, false
}

// deliveryFinding reports a delivery that never succeeded, a permanent refusal (or, in the
// reference, a panic) the reference did not make, and a reference refusal not made.
func deliveryFinding(s schedule, res runResult, want expected, inReference bool) (finding, bool) {
	extra, missing := refusalDiff(res.refused, want.refused)
	if inReference { // the reference's refusals are the expected ones: only a panic is wrong
		extra = panics(res.refused)
	}
	switch {
	case res.failed != nil:
		return finding{seen: fmt.Sprintf("a delivery never succeeded: %v", res.failed), hint: failedHint(s, inReference)}, true
	case len(extra) > 0:
		return finding{
			seen: fmt.Sprintf("a delivery of event %d failed permanently (a real router parks it, unapplied): %s", extra[0]+1, brief(res.refused[extra[0]])),
			hint: refusedHint(s, inReference),
		}, true
	case len(missing) > 0:
		return finding{
			seen: fmt.Sprintf("event %d, refused on a clean delivery (%v), was not refused", missing[0]+1, want.refused[missing[0]]),
			hint: "the handler's refusal depends on something other than the event (the order of arrival, state outside the transaction): decide it from the event alone",
		}, true
	}
	return finding{}, false
}

// failedHint is the hint of a delivery that never succeeded.
func failedHint(s schedule, inReference bool) string {
	if inReference {
		return "the handler fails on a clean delivery of this event, once, in order, with nothing injected: the last error says why (a missing table or column, a constraint, a decoding error, a context it does not have); refuse an event it can never apply with wmonce.Permanent"
	}
	return fmt.Sprintf("the handler keeps failing after %s, though a clean delivery of the same events succeeds: the last error says why; an attempt run again after a rolled-back one must succeed (state left in memory or written outside the transaction by the failed attempt, a unique key taken outside it)", s.fault)
}

// refusedHint is the hint of a permanent refusal the reference did not make (in the reference:
// a panic).
func refusedHint(s schedule, inReference bool) string {
	if inReference {
		return "the handler panics on a clean delivery of this event: refuse an event it cannot apply with wmonce.Permanent (parked, not retried), or fix the panic"
	}
	return fmt.Sprintf("the handler refused permanently (wmonce.Permanent, or a panic) an event that applies cleanly once: under %s it should have succeeded; a refusal must depend on the event alone, not on state a failed or concurrent attempt left behind", s.fault)
}

// effectFinding compares the effect, then the outputs stored in the outbox, with the
// reference's.
func effectFinding(s schedule, res runResult, want expected) finding {
	wantOutputs := fmt.Sprintf("%d (what one clean delivery of each event stores)", res.wantOutputs)
	switch diff := compareEffects(res.effect, want.effect); {
	case diff != same:
		return finding{seen: fmt.Sprintf("an effect %s one clean delivery of each event gives", diff), hint: effectHint(diff, s.fault)}
	case res.outputs < res.wantOutputs:
		return finding{
			seen: fmt.Sprintf("missing output: %d output message(s) stored in the outbox", res.outputs),
			want: wantOutputs,
			hint: "the handler returns its output only some of the times it applies the effect (on a first attempt only, or depending on state outside the transaction, a cache in memory): return the same messages whenever it applies the effect, from the event and what it read through the transaction",
		}
	case res.outputs > res.wantOutputs:
		return finding{
			seen: fmt.Sprintf("extra output: %d output message(s) stored in the outbox", res.outputs),
			want: wantOutputs,
			hint: "the handler's returned messages depend on something outside the transaction (a counter in memory, a read through the pool): derive them from the event and what it read through the transaction",
		}
	}
	return finding{}
}

// brief is err's text without the stack trace of a recovered panic.
func brief(err error) string {
	msg, _, _ := strings.Cut(err.Error(), ", stacktrace:")
	return msg
}

// panics returns the events whose refusal was a panic.
func panics(refused map[int]error) []int {
	var out []int
	for _, e := range sortedKeys(refused) {
		if wmonce.IsPanic(refused[e]) {
			out = append(out, e)
		}
	}
	return out
}

// refusalDiff returns the events refused in got but not in want, and the reverse.
func refusalDiff(got, want map[int]error) (extra, missing []int) {
	return notIn(got, want), notIn(want, got)
}

// notIn returns the events of a that b does not name, in order.
func notIn(a, b map[int]error) []int {
	var out []int
	for _, e := range sortedKeys(a) {
		if _, ok := b[e]; !ok {
			out = append(out, e)
		}
	}
	return out
}

func allIndexes(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// routerPublisher stands for the router's publisher (see Kit.Publisher). It counts what it is
// given and delivers it nowhere; Close does nothing.
type routerPublisher struct{ n atomic.Int64 }

// Publish counts msgs.
func (p *routerPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return nil
}

// Close does nothing.
func (p *routerPublisher) Close() error { return nil }

var _ message.Publisher = (*routerPublisher)(nil)
