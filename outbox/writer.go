package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgnotify"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/tracing"
	"github.com/wmonce/watermill-once/pgtx"
)

// ErrInvalidMessage is wrapped by every refusal of a message that can never be stored or
// forwarded as it is (no UUID, a UUID or metadata that is not text, a topic ValidateTopic
// refuses): retrying cannot succeed, and the middleware reports it as a permanent error.
var ErrInvalidMessage = errors.New("outbox: message cannot be stored")

// codeUndefinedColumn is PostgreSQL's undefined_column.
const codeUndefinedColumn = "42703"

// MaxUUIDLength is the longest UUID stored, in bytes: the longest dedupe key a consumer accepts.
const MaxUUIDLength = 1024

// Writer stores messages in the outbox table inside a caller's transaction.
//
// Guarantee: a message stored with PublishTx becomes visible to the relay if and only if the
// transaction commits; nothing is sent to a broker from inside it. Where it stops: the relay
// forwards it at least once, in the package doc's order, and consumers absorb copies. Each row
// holds the envelope the Relay reads and the columns Debezium reads (outbox/cdc), so a service
// switches between them without rewriting rows. While a relay is idle, a store also notifies it
// at commit (package doc, Waking up).
type Writer struct {
	config    Config
	tracer    trace.Tracer
	table     string
	insertOne string
	insertMny string
	channel   string // relayChannel(config.Schema); empty: the statements do not notify
}

// relayChannel is the LISTEN/NOTIFY channel on which the writers of an outbox schema wake its
// relays. The payload is empty: every relay of the schema reads every row.
func relayChannel(schema string) string { return pgnotify.Channel("wmonce_outbox_", schema) }

// NewWriter returns a Writer for the outbox table in config.Schema. It does not touch the
// database; run the migrations first.
func NewWriter(config Config) (*Writer, error) {
	if err := setup.Config(&config, (*Config).setDefaults, "outbox: invalid config"); err != nil {
		return nil, err
	}
	table := pgtx.QualifiedName(config.Schema, "outbox")
	w := &Writer{config: config, tracer: tracing.Tracer(config.TracerProvider), table: table, channel: relayChannel(config.Schema)}
	w.insertOne, w.insertMny = insertSQL(table, config.Source != "", notifyWhenIdle(config.Schema))
	return w, nil
}

// notifyWhenIdle is the condition under which a store notifies: some relay of the schema
// asked for notifications and its request has not lapsed (wakeup, outbox_offsets.idle_until).
// now() is the transaction's start, so a long transaction errs on the side of notifying.
func notifyWhenIdle(schema string) string {
	return `EXISTS (SELECT 1 FROM ` + pgtx.QualifiedName(schema, "outbox_offsets") + ` WHERE idle_until > now())`
}

// insertSQL returns the statements that store one message and many (the same as arrays):
// $1 uuid, $2 envelope (payload), $3 metadata, $4 destination (one topic per call), $5
// partition_key, $6 type, $7 payload_bytes: the envelope for the Relay and the columns of
// migration 013 for Debezium's Outbox Event Router, in one row. With source, the next
// parameter is the row's source; without, the column keeps its default (”). With a notify
// condition the last parameter is the relay's channel, notified (pg_notify) when the condition
// holds: the notification is delivered when the transaction commits, exactly when the rows
// become visible, and PostgreSQL folds identical notifications of one transaction into one, so
// a transaction that stores several times still sends one. The data-modifying WITH runs to
// completion whatever the outer SELECT reads.
func insertSQL(table string, source bool, notify string) (one, many string) {
	cols, val, next := `uuid, payload, metadata, destination, partition_key, type, payload_bytes, transaction_id`, ``, 8
	if source {
		cols, val, next = cols+`, source`, `, $8`, 9
	}
	one = `INSERT INTO ` + table + ` (` + cols + `) VALUES ($1, $2::json, $3::json, $4, $5, $6, $7, pg_current_xact_id()` + val + `)`
	many = `INSERT INTO ` + table + ` (` + cols + `)
SELECT u, p::json, m::json, $4, k, ty, b, pg_current_xact_id()` + val + `
FROM unnest($1::text[], $2::text[], $3::text[], $5::text[], $6::text[], $7::bytea[]) WITH ORDINALITY AS x(u, p, m, k, ty, b, n) ORDER BY n`
	if notify != "" {
		ch := `$` + strconv.Itoa(next) + `::text`
		one = `WITH ins AS (` + one + `) SELECT pg_notify(` + ch + `, '') WHERE ` + notify
		many = `WITH ins AS (` + many + `) SELECT pg_notify(` + ch + `, '') WHERE ` + notify
	}
	return one, many
}

// Table returns the quoted, schema-qualified outbox table name.
func (w *Writer) Table() string { return w.table }

// PublishTx stores msgs for topic in tx, stamping correlation, causation (from the consumed
// message in ctx) and occurred_at metadata, and W3C trace context when ctx holds a span.
// Messages are stored byte for byte or not at all: it refuses, before writing anything and with
// an error wrapping ErrInvalidMessage, an invalid topic, a nil message, an empty UUID or one
// longer than MaxUUIDLength, a UUID or metadata that is not UTF-8 text without NUL, and delay
// metadata that is not an RFC 3339 time. Payloads are any bytes. A nil tx is
// pgtx.ErrNoTransaction.
func (w *Writer) PublishTx(ctx context.Context, tx pgtx.Executor, topic string, msgs ...*message.Message) error {
	return w.store(ctx, tx, topic, msgs, true, nil)
}

// store is PublishTx; with stamped false it stores the messages as they are (ParkingPublisher).
// keys, when not nil, are the messages' partition keys ("" for the usual rule): a republished
// row keeps its original's. It runs the outbox's one INSERT (insertSQL): every row of the
// outbox is stored here.
func (w *Writer) store(ctx context.Context, tx pgtx.Executor, topic string, msgs []*message.Message, stamped bool, keys []string) (err error) {
	if len(msgs) == 0 {
		return nil
	}
	if setup.IsNil(tx) {
		return fmt.Errorf("outbox: %w: tx is nil (outside a transaction, pgtx.TxFromContext returns a nil *sql.Tx)", pgtx.ErrNoTransaction)
	}
	if err := w.checkBatch(topic, msgs, stamped); err != nil {
		return err
	}
	ctx, span := tracing.StartChild(ctx, w.tracer, tracing.SpanOutboxStore, tracing.Destination.String(topic), tracing.MessageCount.Int(len(msgs)))
	defer func() { tracing.End(span, err) }()
	rows, err := w.encodeRows(ctx, topic, msgs, stamped, keys)
	if err != nil {
		return err
	}
	query, args := w.insertQuery(topic, rows)
	if _, err = tx.ExecContext(ctx, query, args...); err != nil {
		return w.insertError(err, len(msgs), topic)
	}
	return nil
}

// checkBatch refuses, before anything is written, an invalid topic or message; delay metadata
// only on messages to be stamped (parked messages are kept as they came).
func (w *Writer) checkBatch(topic string, msgs []*message.Message, stamped bool) error {
	if err := w.CheckTopic(topic); err != nil {
		return err
	}
	for i, msg := range msgs {
		if err := checkMessage(msg); err != nil {
			return fmt.Errorf("%w: message %d of %d: %w", ErrInvalidMessage, i+1, len(msgs), err)
		}
		if _, _, err := outboxops.DueAt(msg.Metadata); err != nil && stamped {
			return fmt.Errorf("%w: message %s: %w", ErrInvalidMessage, msg.UUID, err)
		}
	}
	return nil
}

// outboxRows are the columns of the rows store inserts, one element per message.
type outboxRows struct {
	uuids, payloads, metadatas, partitionKeys []string
	types                                     []*string
	raws                                      [][]byte
}

// encodeRows stamps the messages (when stamped) and encodes them into the rows to insert.
func (w *Writer) encodeRows(ctx context.Context, topic string, msgs []*message.Message, stamped bool, keys []string) (outboxRows, error) {
	cause, _ := ConsumedFromContext(ctx)
	now := w.config.Now().UTC().Format(time.RFC3339Nano)
	r := outboxRows{
		uuids:         make([]string, len(msgs)),
		payloads:      make([]string, len(msgs)),
		metadatas:     make([]string, len(msgs)),
		partitionKeys: make([]string, len(msgs)),
		types:         make([]*string, len(msgs)),
		raws:          make([][]byte, len(msgs)),
	}
	for i, msg := range msgs {
		if stamped {
			stamp(msg, cause, now)
			tracing.Stamp(ctx, msg)
			if err := checkText("metadata", msg.Metadata); err != nil { // inherited correlation_id
				return r, fmt.Errorf("%w: message %s: %w", ErrInvalidMessage, msg.UUID, err)
			}
		}
		r.uuids[i], r.payloads[i], r.metadatas[i] = msg.UUID, string(marshalEnvelope(topic, msg)), jsonMetadata(msg.Metadata)
		r.partitionKeys[i] = w.partitionKey(msg, keys, i)
		r.types[i] = nullIfEmpty(msg.Metadata.Get(MetadataEventType))
		r.raws[i] = msg.Payload
		if r.raws[i] == nil { // empty bytes, not NULL: the router would send a null value
			r.raws[i] = []byte{}
		}
	}
	return r, nil
}

// partitionKey is keys[i] when given (a republished row keeps its original's), else the
// configured metadata field, else the UUID.
func (w *Writer) partitionKey(msg *message.Message, keys []string, i int) string {
	if keys != nil && keys[i] != "" {
		return keys[i]
	}
	return cmp.Or(msg.Metadata.Get(w.config.PartitionKeyField), msg.UUID)
}

// insertQuery is the insert of one row or of many (arrays), with the source and the
// notification channel when configured.
func (w *Writer) insertQuery(topic string, r outboxRows) (string, []any) {
	query, args := w.insertMny, []any{r.uuids, r.payloads, r.metadatas, topic, r.partitionKeys, r.types, r.raws}
	if len(r.uuids) == 1 {
		query, args = w.insertOne, []any{r.uuids[0], r.payloads[0], r.metadatas[0], topic, r.partitionKeys[0], r.types[0], r.raws[0]}
	}
	if w.config.Source != "" {
		args = append(args, w.config.Source)
	}
	if w.channel != "" {
		args = append(args, w.channel)
	}
	return query, args
}

// insertError says which migration is missing when the table or a column is.
func (w *Writer) insertError(err error, n int, topic string) error {
	if pgtx.IsUndefinedTable(err) {
		return fmt.Errorf("outbox: table %s is missing: run the migrations (migrate.Migrate or `wmonce migrate up`): %w", w.table, err)
	}
	if pgtx.SQLState(err) == codeUndefinedColumn {
		return fmt.Errorf("outbox: table %s lacks a column of migration 012 or 013 (source, destination, payload_bytes, ...): run the migrations (migrate.Migrate or `wmonce migrate up`): %w", w.table, err)
	}
	return fmt.Errorf("outbox: insert %d message(s) for topic %q: %w", n, topic, err)
}

// CheckTopic returns the error (wrapping ErrInvalidMessage) with which PublishTx would refuse
// topic, to check a configured topic at start-up.
func (w *Writer) CheckTopic(topic string) error {
	if err := setup.CheckText("topic", topic); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	if err := w.config.ValidateTopic(topic); err != nil {
		return fmt.Errorf("%w: invalid topic: %w", ErrInvalidMessage, err)
	}
	return nil
}

// checkMessage refuses what cannot be stored byte for byte: the UUID goes to a text column and,
// like metadata, into JSON, where invalid UTF-8 would be replaced by U+FFFD without a word.
func checkMessage(msg *message.Message) error {
	switch {
	case msg == nil:
		return errors.New("message is nil")
	case msg.UUID == "":
		return errors.New("empty UUID: create it with message.NewMessage(watermill.NewUUID(), payload) or a stable business id")
	case len(msg.UUID) > MaxUUIDLength:
		return fmt.Errorf("UUID %.40q... is %d bytes long; the limit is %d (the longest dedupe key a consumer accepts)", msg.UUID, len(msg.UUID), MaxUUIDLength)
	case !setup.IsText(msg.UUID):
		return fmt.Errorf("%w: PostgreSQL text and JSON cannot carry it byte for byte; hex- or base64-encode it", setup.CheckText("UUID", msg.UUID))
	}
	if err := checkText("metadata", msg.Metadata); err != nil {
		return fmt.Errorf("message %s: %w", msg.UUID, err)
	}
	return nil
}

// checkText refuses metadata that JSON would silently alter (invalid UTF-8 becomes U+FFFD) or
// that PostgreSQL text, jsonb and the inbox refuse (NUL).
func checkText(what string, md message.Metadata) error {
	for k, v := range md {
		if err := setup.CheckText(fmt.Sprintf("%s key", what), k); err != nil {
			return fmt.Errorf("%w: it is stored as JSON, which cannot carry it byte for byte", err)
		}
		if err := setup.CheckText(fmt.Sprintf("%s %.40q: value", what, k), v); err != nil {
			return fmt.Errorf("%w: it is stored as JSON, which cannot carry it byte for byte; base64-encode binary values", err)
		}
	}
	return nil
}

func jsonMetadata(md message.Metadata) string {
	if md == nil {
		return "{}"
	}
	b, _ := json.Marshal(md) // a map of strings: encoding cannot fail
	return string(b)
}

// nullIfEmpty is nil (SQL NULL) for "", else &s.
func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
