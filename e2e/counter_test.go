package e2e_test

import (
	"testing"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/e2e"
	"github.com/wmonce/watermill-once/internal/brokertest"
)

// TestReadModifyWriteCounterWithDefaults runs e2e.RunCounter on every broker: a handler that
// reads a counter and writes back one more, under the library's defaults, with duplicates and
// consumer kills, must count every event exactly once.
func TestReadModifyWriteCounterWithDefaults(t *testing.T) {
	for _, kind := range broker.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e2e.RunCounter(t, e2e.Target{
				Name:   string(kind),
				Config: func(t *testing.T, schema string) broker.Config { return brokertest.Config(t, kind, schema) },
			}, e2e.CounterOptions{ConsumerBinary: consumerBinary})
		})
	}
}
