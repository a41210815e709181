package idemkey_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/effects/idemkey"
	"github.com/wmonce/watermill-once/internal/fakeprovider"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// TestCrashBetweenProviderCallAndCommit is the failure the downstream key exists for: the
// handler calls the provider, then its transaction dies before COMMIT (the backend is
// terminated, as when the database connection or the process is lost). The broker redelivers,
// the handler calls again with the same key, and the provider, which deduplicates on it,
// performs the effect once and answers the second call from its record.
func TestCrashBetweenProviderCallAndCommit(t *testing.T) {
	t.Parallel()
	t.Run("provider honours keys", func(t *testing.T) {
		t.Parallel()
		provider, key := runCrashScenario(t, false)
		require.Equal(t, []string{key, key}, provider.Keys(), "the provider saw the same key twice")
		require.Equal(t, 1, provider.Effects(), "and performed the effect once")
	})
	// The control: the same crash against a provider that ignores keys performs the effect
	// twice. This is what the key buys, and the limit of the technique.
	t.Run("provider ignores keys", func(t *testing.T) {
		t.Parallel()
		provider, key := runCrashScenario(t, true)
		require.Equal(t, []string{key, key}, provider.Keys())
		require.Equal(t, 2, provider.Effects())
	})
}

func runCrashScenario(t *testing.T, ignoreKeys bool) (*fakeprovider.Provider, string) {
	db := pgtest.OpenDB(t, 4) // a pool of its own: one of its connections is killed on purpose
	schema := pgtest.Schema(t, db)
	charges := pgtx.QualifiedName(schema, "charges")
	pgtest.Exec(t, db, `CREATE TABLE `+charges+` (message_id text PRIMARY KEY, provider_id text NOT NULL)`)

	provider := fakeprovider.Start(t)
	if ignoreKeys {
		provider.IgnoreKeys()
	}
	transport, err := idemkey.NewTransport(provider.Client().Transport, idemkey.TransportConfig{})
	require.NoError(t, err)
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	logger := watermill.NewStdLogger(false, false)
	eo, err := once.New(db, once.Config{Schema: schema}, logger)
	require.NoError(t, err)

	var attempts atomic.Int32
	done := make(chan struct{})
	handler := func(msg *message.Message) error {
		ctx := msg.Context()
		tx, ok := pgtx.TxFromContext(ctx)
		if !ok {
			return errors.New("no transaction")
		}
		attempt := attempts.Add(1)
		key, err := idemkey.ForMessage(msg, "charge") // consumer = handler name, id = UUID
		if err != nil {
			return err
		}
		req, _ := http.NewRequestWithContext(idemkey.WithKey(ctx, key), http.MethodPost, provider.URL()+"/send", strings.NewReader(string(msg.Payload)))
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var answer fakeprovider.Response
		if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
			return fmt.Errorf("provider answer: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+charges+` VALUES ($1, $2)`, msg.UUID, answer.ID); err != nil {
			return err
		}
		if attempt == 1 {
			// Crash after the provider call, before the commit: terminate this transaction's
			// backend from another connection and wait until it is gone.
			var pid int
			if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			var killed bool
			if err := db.QueryRowContext(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid).Scan(&killed); err != nil || !killed {
				return fmt.Errorf("could not terminate backend %d (terminated: %t): %w", pid, killed, err)
			}
		} else {
			close(done)
		}
		return nil // the middleware now commits; on attempt 1 that COMMIT fails
	}

	pubsub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, logger)
	require.NoError(t, err)
	router.AddConsumerHandler("payments-charger", "payments", pubsub, handler).AddMiddleware(eo.Middleware)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	t.Cleanup(func() { _ = router.Close() })
	<-router.Running()

	require.NoError(t, pubsub.Publish("payments", message.NewMessage("pay-42", []byte(`{"amount":2400}`))))
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the redelivery never succeeded (attempts: %d)", attempts.Load())
	}
	require.NoError(t, router.Close())

	key, err := idemkey.Derive("payments-charger", "pay-42", "charge")
	require.NoError(t, err)
	require.Equal(t, int32(2), attempts.Load(), "the failed commit made the broker redeliver once")
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+charges), "the database applied it once")
	require.Equal(t, 1, pgtest.Count(t, db, `SELECT count(*) FROM `+pgtx.QualifiedName(schema, "processed_messages")))
	if !ignoreKeys {
		stored := ""
		require.NoError(t, db.QueryRow(`SELECT provider_id FROM `+charges+` WHERE message_id = 'pay-42'`).Scan(&stored))
		first, _ := provider.SentID(key)
		require.Equal(t, first, stored, "the committed row holds the id of the one effect")
	}
	return provider, key
}
