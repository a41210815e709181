package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/broker"
)

// narrator prints the walk-through; the services narrate from their own goroutines.
type narrator struct {
	mu  *sync.Mutex
	out io.Writer
}

func newNarrator(out io.Writer) narrator { return narrator{mu: &sync.Mutex{}, out: out} }

func (n narrator) line(s string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	fmt.Fprintln(n.out, s)
}

func (n narrator) step(format string, args ...any) { n.line("==> " + fmt.Sprintf(format, args...)) }

func (n narrator) say(format string, args ...any) { n.line("    " + fmt.Sprintf(format, args...)) }

// logFor returns Watermill's logger on stderr: errors only, or everything from info up.
func logFor(verbose bool) watermill.LoggerAdapter {
	l := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	if verbose {
		return l
	}
	return errorsOnly{l}
}

type errorsOnly struct{ watermill.LoggerAdapter }

func (errorsOnly) Info(string, watermill.LogFields)  {}
func (errorsOnly) Debug(string, watermill.LogFields) {}
func (errorsOnly) Trace(string, watermill.LogFields) {}
func (e errorsOnly) With(f watermill.LogFields) watermill.LoggerAdapter {
	return errorsOnly{e.LoggerAdapter.With(f)}
}

func describe(c broker.Config) string {
	switch c.Kind {
	case broker.Kafka:
		return "Kafka at " + strings.Join(c.Kafka.Brokers, ",") + " (idempotent producer, acks=all, partition key = payment id)"
	case broker.AMQP:
		return "RabbitMQ at " + redact(c.AMQP.URL) + " (publisher confirms, durable " + c.AMQP.QueueType + " queues)"
	default:
		return "Watermill SQL Pub/Sub on PostgreSQL, topic tables in schema " + c.SQL.Schema
	}
}

func redact(raw string) string {
	if i := strings.Index(raw, "@"); i >= 0 {
		if j := strings.Index(raw, "://"); j >= 0 && j < i {
			return raw[:j+3] + "***" + raw[i:]
		}
	}
	return raw
}

// rupees formats integer paise as ₹1,200.00.
func rupees(paise int64) string {
	whole := fmt.Sprint(paise / 100)
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "," + whole[i:]
	}
	return fmt.Sprintf("₹%s.%02d", whole, paise%100)
}

func shortID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
