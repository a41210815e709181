package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/middleware/httpidem"
)

// runDemo plays a client against the running service and checks every answer: a first
// request, a retry (replayed byte for byte), the same key with another payload (422), a
// request without a key (400), and that exactly one PaymentCreated left through the outbox.
func runDemo(ctx context.Context, out io.Writer, baseURL string, a *app) error {
	c := &client{ctx: ctx, http: &http.Client{Timeout: 10 * time.Second}, out: out, baseURL: baseURL}
	key := "demo-" + watermill.NewUUID() // a fresh key per run; a client makes one per operation
	body := `{"amount_paise":240000,"currency":"INR","payee":"acme-traders"}`

	first, err := c.post("1. Create a payment", key, body)
	if err != nil {
		return err
	}
	c.check(first.status == http.StatusCreated, "first request created the payment (got %d)", first.status)
	var created paymentResponse
	if err := json.Unmarshal(first.body, &created); err != nil {
		return fmt.Errorf("decode the created payment: %w", err)
	}

	again, err := c.post("2. Retry it (the response was lost on the way, say)", key, body)
	if err != nil {
		return err
	}
	c.check(again.status == http.StatusCreated && again.replayed == "true", "the retry was answered from the stored response")
	c.check(bytes.Equal(first.body, again.body), "the replayed body is byte for byte the first one")

	other, err := c.post("3. Reuse the key for a different payment", key, `{"amount_paise":999900,"currency":"INR","payee":"acme-traders"}`)
	if err != nil {
		return err
	}
	c.check(other.status == http.StatusUnprocessableEntity, "a different payload under the same key is refused with 422 (got %d)", other.status)

	keyless, err := c.post("4. Forget the key", "", body)
	if err != nil {
		return err
	}
	c.check(keyless.status == http.StatusBadRequest, "a POST without Idempotency-Key is refused with 400 (got %d)", keyless.status)

	fmt.Fprintf(out, "\n5. Effects\n")
	if err := c.checkEffects(a, created); err != nil {
		return err
	}
	if len(c.failures) > 0 {
		return fmt.Errorf("demo: %d check(s) failed: %w", len(c.failures), errors.Join(c.failures...))
	}
	fmt.Fprintf(out, "\nAll checks passed.\n")
	return nil
}

// client is the demo's HTTP client: it prints every exchange and every check, and keeps the
// checks that failed.
type client struct {
	ctx      context.Context
	http     *http.Client
	out      io.Writer
	baseURL  string
	failures []error
}

// answer is what the demo looks at in a response.
type answer struct {
	status   int
	replayed string // the Idempotent-Replayed header
	body     []byte
}

func (c *client) check(ok bool, format string, args ...any) {
	mark := "ok  "
	if !ok {
		mark = "FAIL"
		c.failures = append(c.failures, fmt.Errorf(format, args...))
	}
	fmt.Fprintf(c.out, "  [%s] %s\n", mark, fmt.Sprintf(format, args...))
}

// post sends body to POST /payments as the client "demo-shop", with key as its Idempotency-Key
// (none if empty), and prints the exchange under title.
func (c *client) post(title, key, body string) (answer, error) {
	req, err := http.NewRequestWithContext(c.ctx, http.MethodPost, c.baseURL+"/payments", bytes.NewBufferString(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer demo-shop")
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, replayed: resp.Header.Get(httpidem.ReplayedHeader)}
	a.body, err = io.ReadAll(resp.Body)
	fmt.Fprintf(c.out, "\n%s\n  POST /payments  Idempotency-Key: %q\n  -> %s", title, key, resp.Status)
	if a.replayed != "" {
		fmt.Fprintf(c.out, "  (%s: %s)", httpidem.ReplayedHeader, a.replayed)
	}
	fmt.Fprintf(c.out, "\n  %s\n", bytes.TrimSpace(a.body))
	return a, err
}

// checkEffects checks the database and the broker: one payment, one event in the outbox, and
// that event forwarded by the relay.
func (c *client) checkEffects(a *app, created paymentResponse) error {
	var payments, events int
	if err := a.db.QueryRowContext(c.ctx, `SELECT count(*) FROM `+a.payments+` WHERE payee = 'acme-traders' AND id >= $1`, created.ID).Scan(&payments); err != nil {
		return err
	}
	if err := a.db.QueryRowContext(c.ctx, `SELECT count(*) FROM `+a.outbox.Table()+` WHERE uuid = $1`, created.EventID).Scan(&events); err != nil {
		return err
	}
	c.check(payments == 1, "one payment row for four requests (found %d; counts any created concurrently by other clients too)", payments)
	c.check(events == 1, "one PaymentCreated in the outbox, committed with the payment (found %d)", events)
	forwarded, err := a.waitForwarded(c.ctx, created.EventID, 10*time.Second)
	c.check(err == nil, "the relay forwarded %s to the broker (%d delivery)", created.EventID, forwarded)
	return nil
}

// waitForwarded waits until the broker delivered the event and returns how often it did.
func (a *app) waitForwarded(ctx context.Context, eventID string, timeout time.Duration) (int, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		a.mu.Lock()
		n := a.forwarded[eventID]
		a.mu.Unlock()
		if n > 0 {
			return n, nil
		}
		select {
		case <-a.notify:
		case <-deadline.C:
			return 0, fmt.Errorf("event %s not forwarded within %s", eventID, timeout)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}
