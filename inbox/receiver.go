package inbox

import (
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/groupcommit"
	"github.com/wmonce/watermill-once/internal/lend"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// MaxBatchSize is the largest ReceiverConfig.BatchSize accepted.
const MaxBatchSize = 10000

// ErrReceiverClosed is returned by Handle after Close: the message is nacked and redelivered
// to whichever receiver runs next.
var ErrReceiverClosed = errors.New("inbox: receiver is closed")

// ErrInvalidOrderingKey is wrapped by errors about a message's ordering key. Like
// wmonce.ErrInvalidKey errors, they are permanent (wmonce.IsPermanent).
var ErrInvalidOrderingKey = errors.New("inbox: invalid ordering key")

// ErrInvalidMetadata is wrapped (and made permanent) when a message's metadata cannot be stored
// faithfully: PostgreSQL text and jsonb hold neither invalid UTF-8 nor NUL characters, and
// silently replacing them would hand the processor a different message than was sent.
var ErrInvalidMetadata = errors.New("inbox: invalid metadata")

// Defaults of ReceiverConfig.
const (
	defaultReceiverBatchSize = 500
	defaultReceiverWorkers   = 2
	defaultWriteTimeout      = 10 * time.Second
)

// ReceiverConfig configures a Receiver.
type ReceiverConfig struct {
	// Schema holds the inbox table (migration 002). Default pgtx.DefaultSchema.
	Schema string
	// Consumer names the logical consumer; rows are unique per (Consumer, key), and the
	// Processor works one Consumer's rows. Required: unlike the middleware, the receiver does not
	// fall back to the router handler name, because the processor must be given the same name.
	Consumer string

	// Key returns each message's dedupe key. Default wmonce.KeyFromUUID.
	Key wmonce.KeyFunc
	// MaxKeyLength refuses longer dedupe and ordering keys (in bytes). Default 255, at most
	// 1024.
	MaxKeyLength int
	// OrderingKey returns the key whose messages are processed one at a time, in the order the
	// inbox received them (e.g. wmonce.KeyFromMetadata("account"); "" from your own function:
	// no constraint for that message). Default nil: no ordering, rows are processed in parallel
	// in roughly received order. See docs/inbox.md for Kafka's record key.
	OrderingKey wmonce.KeyFunc

	// BatchSize bounds the rows written by one statement. Default 500, at most
	// MaxBatchSize.
	BatchSize int
	// Linger makes a writer wait this long for company before its first batch. Default 0: a
	// lone message is written at once; under load batches form by themselves.
	Linger time.Duration
	// Workers is the number of batches written at once. Default 2,
	// at most 64.
	Workers int
	// WriteTimeout bounds one batch statement. Default 10s.
	WriteTimeout time.Duration

	// MaxMessageAge is the middleware's age guard, store-first: a copy of a key no longer in the
	// inbox whose event is older than this is stored as a FAILED row (wmonce.ErrTooOld), acked
	// and logged as an ALERT, never processed unless replayed. Zero: off (docs/inbox.md).
	MaxMessageAge time.Duration
	// OccurredAt returns when the event occurred, as carried by the message. Default: the
	// "occurred_at" metadata (RFC 3339) that the outbox stamps. Used by MaxMessageAge only.
	OccurredAt func(msg *message.Message) (t time.Time, ok bool, err error)
	// Now is the clock of the age guard. Default time.Now.
	Now func() time.Time
}

func (c *ReceiverConfig) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
	lend.KeyDefaults(&c.Key, &c.MaxKeyLength)
	c.BatchSize = cmp.Or(c.BatchSize, defaultReceiverBatchSize)
	c.Workers = cmp.Or(c.Workers, defaultReceiverWorkers)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, defaultWriteTimeout)
	lend.AgeGuardDefaults(&c.OccurredAt, &c.Now)
}

// Validate reports what to fix in a configuration.
func (c ReceiverConfig) Validate() error {
	return errors.Join(
		pgtx.ValidateIdentifier("schema", c.Schema),
		validateConsumer(c.Consumer),
		setup.CheckMaxKeyLength(c.MaxKeyLength),
		setup.Between("BatchSize", c.BatchSize, 1, MaxBatchSize),
		setup.Between("Workers", c.Workers, 1, 64),
		setup.Between("Linger", c.Linger, 0, time.Second),
		setup.NotNegative("WriteTimeout", c.WriteTimeout),
		setup.NotNegative("MaxMessageAge", c.MaxMessageAge),
	)
}

// validateConsumer applies setup.CheckName, the rule every component applies to names.
func validateConsumer(consumer string) error {
	if err := setup.CheckName("Consumer", consumer); err != nil {
		return fmt.Errorf("%w (the Receiver, Processor and Ops of one inbox name the same consumer)", err)
	}
	return nil
}

// ReceiverCounters are a receiver's running totals since it was created, for Handle (StoreTx
// writes commit, or not, with the caller's transaction and are not counted).
type ReceiverCounters struct {
	Stored        uint64 // new rows committed
	Duplicates    uint64 // messages acked without a new row: their key was already in the inbox
	Refused       uint64 // messages refused (permanent error) for an unusable key or metadata
	TooOld        uint64 // copies parked as FAILED by the age guard (older than MaxMessageAge)
	Batches       uint64 // statements that committed
	BatchFailures uint64 // statements that failed (their messages were nacked or retried alone)
	Waiting       int64  // Handle calls waiting for their batch right now
}

// Receiver stores delivered messages in the inbox and acks them once stored: Handle returns
// nil only after the message's row (or an earlier copy's) is committed; any error means it may
// not be, and the broker redelivers. A message whose key or metadata cannot be stored is
// refused with a permanent error, never acked (package doc, Refusals). Use Handle as a router
// handler:
//
//	router.AddConsumerHandler("payments-inbox", "payments", subscriber, receiver.Handle)
type Receiver struct {
	db     *sql.DB
	config ReceiverConfig
	logger watermill.LoggerAdapter
	q      queries

	// writers group-commit the rows of concurrent Handle calls (internal/groupcommit).
	writers *groupcommit.Queue[row]

	stored, duplicates, refused, tooOld, batches, batchFailures atomic.Uint64

	// Refused messages seen by Handle (a hash of UUID and payload), to tell when one comes back:
	// see refusedAgain.
	refusedMu   sync.Mutex
	refusedSeen map[[sha256.Size]byte]struct{}
	warnedAgain atomic.Bool

	testSignals receiverTestSignals
}

// row is one message ready to insert.
type row struct {
	key, uuid, orderingKey, topic string
	payload                       []byte
	metadata                      string
	tooOld                        string // the age guard's reason: stored FAILED unless the key exists
	due                           string // when its first attempt may start (RFC 3339); "": at once
}

// NewReceiver validates config and prepares the receiver. Call Close when done. The inbox table
// must exist (run the migrations).
func NewReceiver(db *sql.DB, config ReceiverConfig, logger watermill.LoggerAdapter) (*Receiver, error) {
	logger, err := setup.Component(db, "inbox: db is nil: open one with pgtx.Open", &config, (*ReceiverConfig).setDefaults, "inbox: invalid receiver config", logger)
	if err != nil {
		return nil, err
	}
	r := &Receiver{
		db:     db,
		config: config,
		logger: logger.With(watermill.LogFields{"consumer": config.Consumer}),
		q:      newQueries(config.Schema),
	}
	// Close writes the rows already queued (Drain): every Handle the receiver took gets the
	// outcome of its row.
	r.writers = groupcommit.New(groupcommit.Config{
		Lanes:    config.Workers,
		MaxGroup: config.BatchSize,
		Linger:   config.Linger,
		Drain:    true,
		Closed:   ErrReceiverClosed,
		Queued:   &r.testSignals.Queued,
	}, r.writeBatch)
	return r, nil
}

// Handle stores msg and returns once the row is committed (see Receiver). Its signature is
// message.NoPublishHandlerFunc.
func (r *Receiver) Handle(msg *message.Message) error {
	rw, err := r.prepare(msg, message.SubscribeTopicFromCtx(msg.Context()))
	if err != nil {
		r.refusedAgain(msg, err)
		return err
	}
	// A writer free and nobody waiting: the row is written at once, in this goroutine.
	if r.writers.Alone() {
		defer r.writers.Release()
		return r.writeAlone(rw)
	}
	// No give-up on the message context: the batch may already be on its way to the database,
	// and its outcome, bounded by WriteTimeout, is the only honest answer to give the router.
	return r.writers.Wait(context.Background(), rw)
}

// HandlerFunc adapts Handle to message.HandlerFunc for router.AddHandler; it never returns
// messages.
func (r *Receiver) HandlerFunc() message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) { return nil, r.Handle(msg) }
}

// StoreTx is the transactional twin of Handle: it inserts msgs as received from topic within
// tx, skipping keys already present, and returns how many rows are new (copies the age guard
// parks as FAILED included). The rows, and the
// wake-up of the processors, take effect when tx commits. Every message is checked before
// anything is written; one unusable message fails the call (a permanent error) and writes nothing.
func (r *Receiver) StoreTx(ctx context.Context, tx pgtx.Executor, topic string, msgs ...*message.Message) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	if setup.IsNil(tx) { // also a nil *sql.Tx from pgtx.TxFromContext outside a transaction
		return 0, fmt.Errorf("inbox: StoreTx: %w: tx is nil", pgtx.ErrNoTransaction)
	}
	rows, err := r.prepareAll(msgs, topic)
	if err != nil {
		return 0, err
	}
	// Not counted in Counters: whether these rows commit is up to the caller.
	n, parked, err := r.insert(ctx, tx, rows)
	if err != nil {
		return 0, err
	}
	r.alertTooOld(rows, parked, "stored in the caller's transaction")
	return n, nil
}

// prepareAll prepares every message of a StoreTx call, or fails on the first unusable one:
// nothing is written unless all can be.
func (r *Receiver) prepareAll(msgs []*message.Message, topic string) ([]row, error) {
	rows := make([]row, len(msgs))
	for i, msg := range msgs {
		if msg == nil {
			return nil, wmonce.Permanent(fmt.Errorf("inbox: message %d of %d is nil", i+1, len(msgs)))
		}
		rw, err := r.prepare(msg, topic)
		if err != nil {
			return nil, err
		}
		rows[i] = rw
	}
	return rows, nil
}

// Counters returns the receiver's running totals.
func (r *Receiver) Counters() ReceiverCounters {
	return ReceiverCounters{
		Stored:        r.stored.Load(),
		Duplicates:    r.duplicates.Load(),
		Refused:       r.refused.Load(),
		TooOld:        r.tooOld.Load(),
		Batches:       r.batches.Load(),
		BatchFailures: r.batchFailures.Load(),
		Waiting:       int64(r.writers.Waiting()),
	}
}

// Consumer is the consumer the receiver stores rows for: the label its metrics carry.
func (r *Receiver) Consumer() string { return r.config.Consumer }

// Close stops accepting messages, writes those already queued and returns when every waiting
// Handle has its answer. It is idempotent.
func (r *Receiver) Close() error {
	r.writers.Close()
	return nil
}

// prepare extracts and checks everything the row needs, so that a batch never fails because
// of one bad message.
func (r *Receiver) prepare(msg *message.Message, topic string) (row, error) {
	view := lend.View(msg) // what the key functions get: they cannot ack the delivery
	rw := row{uuid: msg.UUID, topic: topic, payload: msg.Payload}
	var err error
	if rw.key, err = r.dedupeKey(view); err != nil {
		return row{}, r.refuse(msg, err)
	}
	if rw.orderingKey, err = r.orderingKey(view); err != nil {
		return row{}, r.refuse(msg, err)
	}
	if rw.metadata, err = r.storedMetadata(msg, topic); err != nil {
		return row{}, r.refuse(msg, err)
	}
	if rw.tooOld, rw.due, err = r.schedule(view); err != nil {
		return row{}, r.refuse(msg, err)
	}
	if rw.payload == nil {
		rw.payload = []byte{} // a nil slice would be sent as NULL
	}
	return rw, nil
}

// dedupeKey returns msg's dedupe key, checked (wmonce.ErrInvalidKey).
func (r *Receiver) dedupeKey(msg *message.Message) (string, error) {
	key, err := r.config.Key(msg)
	if err == nil {
		err = setup.CheckKey(key, r.config.MaxKeyLength)
	}
	if err != nil {
		return "", fmt.Errorf("%w for message %q (consumer %q): %w", wmonce.ErrInvalidKey, msg.UUID, r.config.Consumer, err)
	}
	return key, nil
}

// orderingKey returns msg's ordering key, checked (ErrInvalidOrderingKey); "" without
// OrderingKey.
func (r *Receiver) orderingKey(msg *message.Message) (string, error) {
	if r.config.OrderingKey == nil {
		return "", nil
	}
	key, err := r.config.OrderingKey(msg)
	if err == nil && key != "" {
		err = setup.CheckKey(key, r.config.MaxKeyLength)
	}
	if err != nil {
		return "", fmt.Errorf("%w for message %q (consumer %q): %w", ErrInvalidOrderingKey, msg.UUID, r.config.Consumer, err)
	}
	return key, nil
}

// storedMetadata returns msg's metadata as the row stores it, and checks that the topic and the
// UUID are text PostgreSQL can hold (ErrInvalidMetadata).
func (r *Receiver) storedMetadata(msg *message.Message, topic string) (string, error) {
	metadata, err := encodeMetadata(msg.Metadata)
	if err = cmp.Or(err, setup.CheckText("topic name", topic), setup.CheckText("message UUID", msg.UUID)); err != nil {
		return "", fmt.Errorf("%w in message %q (consumer %q): %w", ErrInvalidMetadata, msg.UUID, r.config.Consumer, err)
	}
	return metadata, nil
}

// schedule returns the age guard's verdict on msg (checkAge) and when its first attempt is due
// (dueOf); metadata it cannot read is wmonce.ErrMalformedMetadata.
func (r *Receiver) schedule(msg *message.Message) (tooOld, due string, err error) {
	tooOld, err = r.checkAge(msg)
	if err == nil {
		due, err = dueOf(msg)
	}
	if err != nil {
		return "", "", fmt.Errorf("%w: message %q (consumer %q): %w", wmonce.ErrMalformedMetadata, msg.UUID, r.config.Consumer, err)
	}
	return tooOld, due, nil
}

// checkAge is the age guard (ReceiverConfig.MaxMessageAge). It returns why the message is too
// old, or "". Whether that parks it is decided by the insert: only if its key is absent.
func (r *Receiver) checkAge(msg *message.Message) (string, error) {
	if r.config.MaxMessageAge == 0 {
		return "", nil
	}
	occurredAt, ok, err := r.config.OccurredAt(msg)
	if err != nil || !ok {
		return "", err
	}
	age := r.config.Now().Sub(occurredAt)
	if age <= r.config.MaxMessageAge {
		return "", nil
	}
	return fmt.Sprintf("%v: event occurred %s ago (at %s), beyond MaxMessageAge %s: its row may already have been deleted by retention, so processing it could apply it twice. Parked by the receiver, never processed: replay it to process it anyway, or skip it",
		wmonce.ErrTooOld, age.Round(time.Second), occurredAt.Format(time.RFC3339), r.config.MaxMessageAge), nil
}

// alertTooOld reports copies the age guard parked.
func (r *Receiver) alertTooOld(rows []row, parked []string, where string) {
	if len(parked) == 0 {
		return
	}
	reasons := make(map[string]string, len(parked))
	for _, rw := range rows {
		if rw.tooOld != "" {
			reasons[rw.key] = rw.tooOld
		}
	}
	for _, key := range parked {
		r.logger.Error("ALERT: copy older than MaxMessageAge "+where+" as FAILED, not processed", errors.New(reasons[key]), watermill.LogFields{"dedupe_key": key})
	}
}

// maxRefusedSeen bounds the refused messages refusedAgain remembers (32 bytes each).
const maxRefusedSeen = 1024

// refusedAgain warns, once per Receiver, when Handle refuses a message it refused before: nothing
// in front of it parked the message, so the broker redelivers it forever and its partition or
// queue stays stopped. No constructor of ours sees the poison queue put in front of Handle
// (Watermill's), so this is where a missing one, or one whose publisher cannot park (the
// Writer's DBPublisher, as the docs once said), shows.
func (r *Receiver) refusedAgain(msg *message.Message, refusal error) {
	h := sha256.New()
	h.Write([]byte(msg.UUID))
	h.Write([]byte{0})
	h.Write(msg.Payload)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	r.refusedMu.Lock()
	_, seen := r.refusedSeen[sum]
	if !seen {
		if r.refusedSeen == nil || len(r.refusedSeen) >= maxRefusedSeen {
			r.refusedSeen = map[[sha256.Size]byte]struct{}{}
		}
		r.refusedSeen[sum] = struct{}{}
	}
	r.refusedMu.Unlock()
	if !seen || !r.warnedAgain.CompareAndSwap(false, true) {
		return
	}
	// Watermill's logger has no warning level: an error-level line marked WARNING.
	r.logger.Error("WARNING: a message the receiver refused was delivered again: nothing parked it, so it is redelivered forever and holds back its partition or queue."+
		" Put Watermill's poison queue in front of Handle, publishing through outbox.Writer.ParkingPublisher(db) (not DBPublisher, which refuses exactly such messages; see docs/inbox.md). Logged once",
		refusal, watermill.LogFields{"message_uuid": msg.UUID})
}

func (r *Receiver) refuse(msg *message.Message, cause error) error {
	r.refused.Add(1)
	err := wmonce.Permanent(cause)
	r.testSignals.Refused.Signal(err)
	r.logger.Error("Message refused: not stored in the inbox, not acked", err, watermill.LogFields{"message_uuid": msg.UUID})
	return err
}

func encodeMetadata(md message.Metadata) (string, error) {
	if len(md) == 0 {
		return "{}", nil
	}
	for k, v := range md {
		if err := setup.CheckText(fmt.Sprintf("metadata field %.40q", k), k, v); err != nil {
			return "", err
		}
	}
	b, err := json.Marshal(md)
	return string(b), err
}

// writeAlone writes the row of a Handle that found a writer free and nobody waiting, in its
// own goroutine: a lone message is written at once, as a batch of one.
func (r *Receiver) writeAlone(rw row) error {
	r.testSignals.BatchTaken.Signal(1)
	ctx, cancel := context.WithTimeout(context.Background(), r.config.WriteTimeout)
	defer cancel()
	if err := r.writeRows(ctx, []row{rw}); err != nil {
		r.logger.Error("Inbox batch failed; its messages are nacked", err, watermill.LogFields{"messages": 1})
		return err
	}
	return nil
}

// writeBatch writes the rows of every Handle that waited for a writer (up to BatchSize, after
// Linger) in one statement, and answers each.
func (r *Receiver) writeBatch(batch []*groupcommit.Member[row]) {
	r.testSignals.BatchTaken.Signal(len(batch))
	rows := make([]row, len(batch))
	for i, m := range batch {
		rows[i] = m.Item
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.config.WriteTimeout)
	defer cancel()
	err := r.writeRows(ctx, rows)
	if err == nil {
		answerAll(batch, nil)
		return
	}
	if len(batch) == 1 || pgtx.IsConnectionError(err) || ctx.Err() != nil {
		r.logger.Error("Inbox batch failed; its messages are nacked", err, watermill.LogFields{"messages": len(batch)})
		answerAll(batch, err)
		return
	}
	// All input was checked in prepare, but a row may still trip something we did not foresee:
	// write each on its own so that one row cannot fail its neighbours.
	r.logger.Error("Inbox batch failed; writing its rows one by one", err, watermill.LogFields{"messages": len(batch)})
	for _, m := range batch {
		m.Answer(r.writeRows(ctx, []row{m.Item}))
	}
}

// answerAll gives every member of batch the same answer.
func answerAll(batch []*groupcommit.Member[row], err error) {
	for _, m := range batch {
		m.Answer(err)
	}
}

// writeRows writes rows in one statement (insertRetrying) and counts the outcome.
func (r *Receiver) writeRows(ctx context.Context, rows []row) error {
	n, parked, err := r.insertRetrying(ctx, rows)
	if err != nil {
		return err
	}
	r.count(rows, n, parked)
	return nil
}

// count records the outcome of one committed statement: n new rows, parked of them parked by
// the age guard.
func (r *Receiver) count(rows []row, n int, parked []string) {
	r.stored.Add(uint64(n - len(parked)))
	r.tooOld.Add(uint64(len(parked)))
	r.duplicates.Add(uint64(len(rows) - n))
	r.alertTooOld(rows, parked, "parked")
	r.testSignals.BatchCommitted.Signal(committedBatch{Rows: len(rows), Stored: n - len(parked), Duplicates: len(rows) - n, Parked: parked})
}

// insertRetrying runs the batch statement, again after a deadlock: two batches carrying copies
// of the same keys in opposite orders wait for each other on the unique index, and PostgreSQL
// aborts one of them having written nothing.
func (r *Receiver) insertRetrying(ctx context.Context, rows []row) (n int, parked []string, err error) {
	err = pgtx.Retry(ctx, pgtx.RetryPolicy{MaxAttempts: 5}, func(ctx context.Context, _ int) error {
		var err error
		if n, parked, err = r.insert(ctx, r.db, rows); err != nil {
			r.batchFailures.Add(1)
			return err
		}
		r.batches.Add(1)
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return n, parked, nil
}

// insert returns how many rows are new and the keys of those the age guard parked.
func (r *Receiver) insert(ctx context.Context, q pgtx.Executor, rows []row) (int, []string, error) {
	keys := make([]string, len(rows))
	uuids := make([]string, len(rows))
	orderingKeys := make([]string, len(rows))
	topics := make([]string, len(rows))
	payloads := make([][]byte, len(rows))
	metadata := make([]string, len(rows))
	tooOld := make([]string, len(rows))
	dues := make([]string, len(rows))
	for i, rw := range rows {
		keys[i], uuids[i], orderingKeys[i], topics[i] = rw.key, rw.uuid, rw.orderingKey, rw.topic
		payloads[i], metadata[i], tooOld[i], dues[i] = rw.payload, rw.metadata, rw.tooOld, rw.due
	}
	var n int
	var parkedJSON string
	var notified sql.NullString
	err := q.QueryRowContext(ctx, r.q.ingest, r.config.Consumer, keys, uuids, orderingKeys, topics, payloads, metadata, r.q.channel, tooOld, dues).Scan(&n, &parkedJSON, &notified)
	if err != nil {
		if pgtx.IsUndefinedTable(err) {
			return 0, nil, fmt.Errorf("inbox: table %s is missing: run the migrations (migrate.Migrate or `wmonce migrate up`): %w", r.q.table, err)
		}
		return 0, nil, fmt.Errorf("inbox: store %d message(s): %w", len(rows), err)
	}
	var parked []string
	if err := json.Unmarshal([]byte(parkedJSON), &parked); err != nil {
		return 0, nil, fmt.Errorf("inbox: store %d message(s): read the keys parked as too old: %w", len(rows), err)
	}
	return n, parked, nil
}
