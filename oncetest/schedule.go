package oncetest

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Mode is one way the library runs a handler.
type Mode string

// The modes.
const (
	// ModeOwnTx: once.Middleware in a transaction of its own per message (Kafka, RabbitMQ).
	ModeOwnTx Mode = "own transaction"
	// ModeGroupCommit: once.Middleware with GroupCommit: messages in flight at the same time
	// share one transaction.
	ModeGroupCommit Mode = "group commit"
	// ModeSubscriberTx: once.Middleware inside the transaction of watermill-sql's subscriber.
	ModeSubscriberTx Mode = "SQL subscriber transaction"
	// ModeInbox: the inbox Receiver stores each copy and the Processor runs the handler.
	ModeInbox Mode = "inbox"
)

// AllModes are the modes Check runs by default.
var AllModes = []Mode{ModeOwnTx, ModeGroupCommit, ModeSubscriberTx, ModeInbox}

func (m Mode) valid() bool { return slices.Contains(AllModes, m) }

// Fault is one adversarial delivery pattern.
type Fault string

// The faults.
const (
	// FaultSequentialCopies delivers every event three times, each after the previous commit.
	FaultSequentialCopies Fault = "sequential copies (redelivery after a lost ack)"
	// FaultConcurrentCopies delivers four copies of every event at the same time.
	FaultConcurrentCopies Fault = "concurrent copies"
	// FaultConcurrentEvents delivers every event once, all at the same time.
	FaultConcurrentEvents Fault = "concurrent events"
	// FaultTransient fails one event's first attempt after its handler returned.
	FaultTransient Fault = "transient failure and retry"
	// FaultKillMidHandler terminates the connection after one event's handler wrote.
	FaultKillMidHandler Fault = "connection killed mid-handler"
	// FaultKillDuringCommit terminates the connection while PostgreSQL runs one event's COMMIT.
	FaultKillDuringCommit Fault = "connection killed during COMMIT"
	// FaultShutdown closes the router while one event's handler runs, then delivers it again.
	FaultShutdown Fault = "router shutdown mid-handler"
	// FaultReorder delivers the events out of their producer's order.
	FaultReorder Fault = "reordered events"
	// FaultFailingNeighbours shares a group-commit transaction with failing messages.
	FaultFailingNeighbours Fault = "group-commit neighbours that fail"

	// FaultNone is the reference: every event once, in order.
	FaultNone Fault = "clean delivery"
)

// AllFaults are the faults Check injects by default.
var AllFaults = []Fault{
	FaultSequentialCopies, FaultConcurrentCopies, FaultConcurrentEvents, FaultTransient,
	FaultKillMidHandler, FaultKillDuringCommit, FaultShutdown, FaultReorder, FaultFailingNeighbours,
}

func (f Fault) valid() bool { return slices.Contains(AllFaults, f) }

// appliesTo says whether f means something in mode with n events.
func (f Fault) appliesTo(mode Mode, n int) bool {
	switch f {
	case FaultFailingNeighbours:
		return mode == ModeGroupCommit
	case FaultReorder, FaultConcurrentEvents:
		return n > 1
	}
	return true
}

// targeted faults hit one event's first attempt.
func (f Fault) targeted() bool {
	switch f {
	case FaultTransient, FaultKillMidHandler, FaultKillDuringCommit, FaultShutdown:
		return true
	}
	return false
}

// schedule is one run's deliveries: the events at order, each delivered copies times (at the
// same time when concurrent), the fault on the first attempt of the event at target (-1: none).
type schedule struct {
	fault      Fault
	order      []int
	copies     int
	concurrent bool
	target     int
}

// faultShapes are the copies of each event (default 1) and whether they are delivered at the
// same time, per fault.
var faultShapes = map[Fault]struct {
	copies     int
	concurrent bool
}{
	FaultSequentialCopies:  {copies: 3},
	FaultConcurrentCopies:  {copies: 4, concurrent: true},
	FaultConcurrentEvents:  {concurrent: true},
	FaultFailingNeighbours: {concurrent: true},
}

func (k *Kit) newSchedule(f Fault, n int) schedule {
	// One stream per fault, so adding a fault does not change the others' schedules.
	r := rand.New(rand.NewPCG(k.seed, uint64(len(f))*0x9e3779b97f4a7c15^hashString(string(f))))
	shape := faultShapes[f]
	s := schedule{fault: f, order: allIndexes(n), copies: cmp.Or(shape.copies, 1), concurrent: shape.concurrent, target: -1}
	if f == FaultReorder {
		for slices.IsSorted(s.order) {
			r.Shuffle(n, func(i, j int) { s.order[i], s.order[j] = s.order[j], s.order[i] })
		}
	}
	if f.targeted() {
		s.target = r.IntN(n)
	}
	return s
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

// scheduleWords says, after the list of events, what each fault that hits no one event
// delivered ({copies}: the copies of each event).
var scheduleWords = map[Fault]string{
	FaultNone:              ", each delivered once, in order",
	FaultSequentialCopies:  ", each delivered {copies} times, one copy after the other (each after the previous one committed, as after a lost ack)",
	FaultConcurrentCopies:  ", {copies} copies of each delivered at the same time",
	FaultConcurrentEvents:  ", delivered once each, all at the same time (with group commit: in one transaction, behind busy lanes)",
	FaultReorder:           ", delivered once each, in this order (the producer sent them in order)",
	FaultFailingNeighbours: ", delivered at the same time as messages whose handlers fail once, all in one group-commit transaction",
}

// targetWords says what a targeted fault did to its event.
var targetWords = map[Fault]string{
	FaultTransient:        "its first attempt failed with a transient error after the handler returned; the library rolled back and retried it",
	FaultKillMidHandler:   "its connection was terminated (pg_terminate_backend) after the handler returned, before COMMIT; the attempt rolled back and the message was redelivered",
	FaultKillDuringCommit: "its connection was terminated during COMMIT; the attempt rolled back and the message was redelivered",
	FaultShutdown:         "the router was closed while its handler ran (the message context cancelled; the inbox Processor closed), and the message was delivered again afterwards",
}

// describe says in words what the schedule delivered.
func (s schedule) describe(events []*message.Message) string {
	list := s.eventList(events)
	if words, ok := scheduleWords[s.fault]; ok {
		return list + strings.ReplaceAll(words, "{copies}", strconv.Itoa(s.copies))
	}
	what := targetWords[s.fault]
	if len(s.order) == 1 {
		return fmt.Sprintf("%s, delivered once: %s", list, what)
	}
	return fmt.Sprintf("%s, delivered once each, in order; %s: %s", list, eventName(events, s.target), what)
}

// eventList names the schedule's events: by number, or the one event with its UUID.
func (s schedule) eventList(events []*message.Message) string {
	if len(s.order) == 1 {
		return eventName(events, s.order[0])
	}
	names := make([]string, len(s.order))
	for i, e := range s.order {
		names[i] = fmt.Sprintf("%d", e+1)
	}
	return "events " + strings.Join(names, ", ")
}

// eventName names event i with its UUID.
func eventName(events []*message.Message, i int) string {
	return fmt.Sprintf("event %d (uuid %s)", i+1, events[i].UUID)
}
