package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/outbox"
)

// The failing-handler variants (issue 38): one message in five fails every attempt until
// failFor after its first attempt (a dependency that needs a moment), through the Stack with
// Retry only, or with delayed retries. They report the throughput of the healthy messages:
// what a failing message's retries cost the others.
const (
	FRetry        = "F-retry"
	FRetryShort   = "F-retry-short"
	FDelayed      = "F-delayed"
	FDelayedShort = "F-delayed-short"

	failEvery = 5
	failFor   = time.Second
)

func init() {
	variantTitles[FRetry] = "Stack, Retry only (defaults: 3 retries from 100 ms): 20% of messages fail for 1 s; healthy messages/s"
	variantTitles[FRetryShort] = "as F-retry, with Retry MaxRetries 1 from 10 ms (then a nack); healthy messages/s"
	variantTitles[FDelayed] = "as F-retry, with DelayedRetries [1s, 2s] (Retry defaults); healthy messages/s"
	variantTitles[FDelayedShort] = "as F-delayed, with Retry MaxRetries 1 from 10 ms; healthy messages/s"
	allVariants = append(allVariants, FRetry, FRetryShort, FDelayed, FDelayedShort)
	// Named only: each failing message holds its slot for a second, which "all" cannot afford.
	namedOnlyVariants = append(namedOnlyVariants, FRetry, FRetryShort, FDelayed, FDelayedShort)
	// Last: the retry copies the relay sends back to the topic reach every later group.
	consumingVariants = append(consumingVariants, FRetry, FRetryShort, FDelayed, FDelayedShort)
}

func isFailingVariant(id string) bool {
	return id == FRetry || id == FRetryShort || id == FDelayed || id == FDelayedShort
}

// failingMessage reports whether the message of payload(i) is one of the failing fifth.
func failingMessage(msg *message.Message) bool {
	var i int
	_, err := fmt.Sscanf(string(msg.Payload), `{"seq":%d`, &i)
	return err == nil && i%failEvery == 0
}

// healthyOf is how many of n published messages are healthy.
func healthyOf(n int) int { return n - (n+failEvery-1)/failEvery }

var errNotYet = errors.New("bench: dependency not ready yet")

// failing is a failing-handler variant's Stack, handler and relay.
type failing struct {
	mws     []message.HandlerMiddleware
	handler message.NoPublishHandlerFunc
	notes   string
	close   func()
}

func (h *harness) failingVariant(ctx context.Context, r *rig, id, consumer string, apply message.NoPublishHandlerFunc) (*failing, error) {
	mw, err := once.New(h.db, once.Config{Schema: h.opts.schema, Consumer: consumer}, h.logger)
	if err != nil {
		return nil, err
	}
	f := &failing{close: func() { _ = mw.Close() }}
	cfg := once.StackConfig{Middleware: mw, Logger: watermill.NopLogger{}}
	f.notes = "Stack defaults"
	short := wmiddleware.Retry{MaxRetries: 1, InitialInterval: 10 * time.Millisecond}
	if id == FRetryShort {
		cfg.Retry, f.notes = short, "Retry MaxRetries 1 from 10 ms"
	}
	if id == FDelayed || id == FDelayedShort {
		cfg.DelayedRetries = []time.Duration{time.Second, 2 * time.Second}
		f.notes = "DelayedRetries [1s, 2s], relay running"
		if id == FDelayedShort {
			cfg.Retry = short
			f.notes += ", Retry MaxRetries 1 from 10 ms"
		}
		pub, err := r.b.NewPublisher(ctx)
		if err != nil {
			return nil, err
		}
		relay, err := outbox.NewRelay(h.db, pub, outbox.RelayConfig{Schema: h.opts.schema, Name: "bench-" + r.runID + "-" + consumer}, h.logger)
		if err != nil {
			_ = pub.Close()
			return nil, err
		}
		done := make(chan error, 1)
		go func() { done <- relay.Run(ctx) }()
		f.close = func() {
			_ = relay.Close()
			if err := <-done; err != nil {
				h.logger.Error("Relay of "+id+" ended with an error", err, nil)
			}
			_ = pub.Close()
			_ = mw.Close()
		}
	}
	stack, err := once.Stack(cfg)
	if err != nil {
		f.close()
		return nil, err
	}
	f.mws = stack
	var first sync.Map // uuid -> time of its first attempt
	f.handler = func(msg *message.Message) error {
		if failingMessage(msg) {
			at, _ := first.LoadOrStore(msg.UUID, time.Now())
			if time.Since(at.(time.Time)) < failFor {
				return errNotYet
			}
		}
		return apply(msg)
	}
	return f, nil
}

// healthyOnly passes the healthy messages through meter, the failing ones around it.
func healthyOnly(meter message.HandlerMiddleware) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		metered := meter(h)
		return func(msg *message.Message) ([]*message.Message, error) {
			if failingMessage(msg) {
				return h(msg)
			}
			return metered(msg)
		}
	}
}
