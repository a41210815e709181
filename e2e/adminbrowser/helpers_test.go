package adminbrowser_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/outbox"
)

// The helpers below are ops/admin's own test helpers (outbox_ops_test.go, failures_test.go),
// copied: a test file of another module cannot import them.

// refusingPublisher refuses for good (as a broker refuses a record too large) every call
// holding a message of refuse, until refuse is cleared.
type refusingPublisher struct{ refuse map[string]bool }

func (p *refusingPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if p.refuse[m.UUID] {
			return wmonce.Permanent(errors.New("kafka server: Message was too large, server rejected it"))
		}
	}
	return nil
}
func (p *refusingPublisher) Close() error { return nil }

// kafkaRejects has relay "kafka" set aside the row of message id: the broker refuses it.
func (f *fixture) kafkaRejects(t *testing.T, id string) (*outbox.Relay, *refusingPublisher) {
	t.Helper()
	pub := &refusingPublisher{refuse: map[string]bool{}}
	relay, err := outbox.NewRelay(f.db, pub, outbox.RelayConfig{Schema: f.schema, Name: "kafka"}, nil)
	require.NoError(t, err)
	var uuid string
	require.NoError(t, f.db.QueryRow(`SELECT uuid FROM `+f.table("outbox")+` WHERE metadata->>'causation_id' = $1`, id).Scan(&uuid))
	pub.refuse[uuid] = true
	// A new relay reads the outbox from its start: it also rejects the fixture's undecodable row.
	relayUntil(t, relay, "reject the row of "+id, func(st outbox.RelayCounters) bool { return st.Rejected >= 2 })
	return relay, pub
}

// failureGroup returns the group of kind at owner (consumer, handler or relay) and topic.
func failureGroup(t *testing.T, groups []operate.FailureGroup, kind, owner, topic string) operate.FailureGroup {
	t.Helper()
	for _, g := range groups {
		if g.Kind == kind && g.Consumer+g.Handler+g.Relay == owner && g.Topic == topic {
			return g
		}
	}
	t.Fatalf("no %s failure group of %q on topic %q in %+v", kind, owner, topic, groups)
	return operate.FailureGroup{}
}
