package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/pgtx"
)

// TestWalkThrough runs the demo on each broker and checks the measured figures and the
// narration of every step.
func TestWalkThrough(t *testing.T) {
	t.Parallel()
	for _, kind := range broker.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			db := pgtest.DB(t)
			prefix := pgtest.NewName("demo")
			t.Cleanup(func() {
				for _, s := range []string{"_payments", "_rewards", "_notifications", "_broker"} {
					pgtest.Exec(t, db, `DROP SCHEMA IF EXISTS `+pgtx.QuoteIdentifier(prefix+s)+` CASCADE`)
				}
			})
			cfg := brokertest.Config(t, kind, prefix+"_broker")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			res, err := Run(ctx, Options{Broker: cfg, Prefix: prefix, Out: &out})
			require.NoError(t, err, out.String())
			require.Equal(t, Result{Broker: string(kind), Deliveries: 3, Applied: 1, CashbackPaise: 2400, SMSSent: 1}, res)

			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			var last Result
			require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &last), "the last line is the JSON result")
			require.Equal(t, res, last)
			for _, want := range []string{
				"committed pay_42 SUCCESS (₹1,200.00) and PaymentSucceeded e-91 in ONE transaction",
				"relay #1: published e-91", "CRASHED before recording its position",
				"relay #2: restarted from the recorded position and published e-91 AGAIN",
				"delivery #1 of e-91", "APPLIED: credited 2% cashback ₹24.00 (2400 paise)",
				"DUPLICATE absorbed", "a third copy under a NEW transport id",
				"recorded the SMS intent", "sender CRASHED before marking the intent SENT",
				"replayed=true): no second SMS",
			} {
				require.Contains(t, out.String(), want)
			}
			require.Equal(t, 2, strings.Count(out.String(), "DUPLICATE absorbed"))
		})
	}
}

func TestRupees(t *testing.T) {
	t.Parallel()
	for paise, want := range map[int64]string{0: "₹0.00", 2400: "₹24.00", 120000: "₹1,200.00", 123456789: "₹1,234,567.89", 5: "₹0.05"} {
		require.Equal(t, want, rupees(paise))
	}
}
