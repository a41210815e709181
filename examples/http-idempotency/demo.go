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

	"github.com/wmonce/watermill-once/httpidem"
)

// runDemo plays a client against the running service and checks every answer: a first
// request, a retry (replayed byte for byte), the same key with another payload (422), a
// request without a key (400), and that exactly one PaymentCreated left through the outbox.
func runDemo(ctx context.Context, out io.Writer, baseURL string, a *app) error {
	client := &http.Client{Timeout: 10 * time.Second}
	key := "demo-" + watermill.NewUUID() // a fresh key per run; a client makes one per operation
	body := `{"amount_paise":240000,"currency":"INR","payee":"acme-traders"}`
	var failures []error
	check := func(ok bool, format string, args ...any) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
			failures = append(failures, fmt.Errorf(format, args...))
		}
		fmt.Fprintf(out, "  [%s] %s\n", mark, fmt.Sprintf(format, args...))
	}
	post := func(title, key, body string) (*http.Response, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/payments", bytes.NewBufferString(body))
		if err != nil {
			return nil, nil, err
		}
		req.Header.Set("Authorization", "Bearer demo-shop")
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		fmt.Fprintf(out, "\n%s\n  POST /payments  Idempotency-Key: %q\n  -> %s", title, key, resp.Status)
		if v := resp.Header.Get(httpidem.ReplayedHeader); v != "" {
			fmt.Fprintf(out, "  (%s: %s)", httpidem.ReplayedHeader, v)
		}
		fmt.Fprintf(out, "\n  %s\n", bytes.TrimSpace(b))
		return resp, b, err
	}

	resp, first, err := post("1. Create a payment", key, body)
	if err != nil {
		return err
	}
	check(resp.StatusCode == http.StatusCreated, "first request created the payment (got %d)", resp.StatusCode)
	var created paymentResponse
	if err := json.Unmarshal(first, &created); err != nil {
		return fmt.Errorf("decode the created payment: %w", err)
	}

	resp, again, err := post("2. Retry it (the response was lost on the way, say)", key, body)
	if err != nil {
		return err
	}
	check(resp.StatusCode == http.StatusCreated && resp.Header.Get(httpidem.ReplayedHeader) == "true", "the retry was answered from the stored response")
	check(bytes.Equal(first, again), "the replayed body is byte for byte the first one")

	resp, _, err = post("3. Reuse the key for a different payment", key, `{"amount_paise":999900,"currency":"INR","payee":"acme-traders"}`)
	if err != nil {
		return err
	}
	check(resp.StatusCode == http.StatusUnprocessableEntity, "a different payload under the same key is refused with 422 (got %d)", resp.StatusCode)

	resp, _, err = post("4. Forget the key", "", body)
	if err != nil {
		return err
	}
	check(resp.StatusCode == http.StatusBadRequest, "a POST without Idempotency-Key is refused with 400 (got %d)", resp.StatusCode)

	fmt.Fprintf(out, "\n5. Effects\n")
	var payments, events int
	if err := a.db.QueryRowContext(ctx, `SELECT count(*) FROM `+a.payments+` WHERE payee = 'acme-traders' AND id >= $1`, created.ID).Scan(&payments); err != nil {
		return err
	}
	if err := a.db.QueryRowContext(ctx, `SELECT count(*) FROM `+a.outbox.Table()+` WHERE uuid = $1`, created.EventID).Scan(&events); err != nil {
		return err
	}
	check(payments == 1, "one payment row for four requests (found %d; counts any created concurrently by other clients too)", payments)
	check(events == 1, "one PaymentCreated in the outbox, committed with the payment (found %d)", events)
	forwarded, err := a.waitForwarded(ctx, created.EventID, 10*time.Second)
	check(err == nil, "the relay forwarded %s to the broker (%d delivery)", created.EventID, forwarded)

	if len(failures) > 0 {
		return fmt.Errorf("demo: %d check(s) failed: %w", len(failures), errors.Join(failures...))
	}
	fmt.Fprintf(out, "\nAll checks passed.\n")
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
