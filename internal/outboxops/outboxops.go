// Package outboxops holds the outbox's operator functions that the CLI, the admin page
// (internal/operate), the retention janitor and outbox/cdc call and users do not: failure
// groups of rejected rows and parked copies, the rejected-row list, whether a relay leads,
// slot positions. Their SQL stays in package outbox, the tables' owner, which sets the
// functions below when it is linked (every caller imports outbox for its public API).
package outboxops

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
)

// RejectedGroup is the rows of outbox_rejected that one relay set aside for one topic with the
// same error once its volatile parts (UUIDs, addresses, hex, numbers) are replaced: a topic the
// broker refuses is one group. The rule and the fingerprint are the schema's (migration 015),
// the same as the inbox's failure groups.
type RejectedGroup struct {
	Fingerprint string // 16 hex digits; selects the group in RepublishRejectedGroup and DiscardRejectedGroup
	Relay       string
	Topic       string // "" for rows the relay could not decode
	Pattern     string // the error with <uuid>, <addr>, <hex> and <n> in place of the volatile parts
	Example     string // the error of the group's newest rejection
	Rows        int64
	FirstSeen   time.Time // rejected_at of the group's first and last rejection
	LastSeen    time.Time
}

// RejectedGroupRequest selects the rows of one rejected group.
type RejectedGroupRequest struct {
	// Fingerprint is RejectedGroup.Fingerprint. Required.
	Fingerprint string
	// Offsets, when given, narrow the group to these outbox offsets: pass those a dry run
	// returned to touch exactly them.
	Offsets []int64
	// DryRun lists the rows and changes nothing.
	DryRun bool
}

// RejectedGroupResult lists the rows an operation on a rejected group changed or, for a dry
// run, would change: the relay and the outbox offsets. Undecodable (republish only) lists the
// offsets left in outbox_rejected because they are not a message the relay can decode.
type RejectedGroupResult struct {
	Relay       string
	Offsets     []int64
	Undecodable []int64
}

// ParkedGroup is the parked messages of one handler and consumed topic with the same reason
// once its volatile parts (UUIDs, addresses, hex, numbers) are replaced.
type ParkedGroup struct {
	Fingerprint string // 16 hex digits; selects the group in ReplayParkedGroup and DiscardParkedGroup
	Handler     string // the poison queue's handler_poisoned ("" outside a router)
	Topic       string // the topic the messages were consumed from (topic_poisoned)
	Pattern     string // the reason with <uuid>, <addr>, <hex> and <n> in place of the volatile parts
	Example     string // the reason of the group's newest parked copy
	Rows        int64
	FirstSeen   time.Time // when the first and the last copy were parked (outbox created_at)
	LastSeen    time.Time
}

// ParkedGroupRequest selects the parked copies of one group.
type ParkedGroupRequest struct {
	// Fingerprint is ParkedGroup.Fingerprint. Required.
	Fingerprint string
	// Offsets, when given, narrow the group to these outbox offsets: pass those a dry run
	// returned to touch exactly them.
	Offsets []int64
	// DryRun lists the rows and changes nothing.
	DryRun bool
}

// ParkedGroupResult lists the parked copies an operation settled or, for a dry run, would
// settle (their outbox offsets). Unreplayable (replay only) lists copies that name no topic
// they were consumed from, cannot be decoded, or whose original UUID or metadata the outbox
// cannot store (a message parked for exactly that): they are left in the group, to discard.
type ParkedGroupResult struct {
	Offsets      []int64
	Unreplayable []int64
}

// RejectedRow is a row of outbox_rejected: an outbox row a relay set aside instead of
// forwarding, because it could not decode it (written by something other than watermill-once;
// Topic is then empty) or because the publisher refused it for good (RelayConfig.IsPermanent;
// Topic is its destination). The relay rejects a row at the first such failure, so there is no
// attempt count; LastError is the decoding error or the publisher's. Payload and Metadata are
// the JSON the row held (the outbox columns are of type json), as text; they are nil unless
// asked for. Source is the row's source (Config.Source).
type RejectedRow struct {
	Relay         string
	Offset        int64
	TransactionID string
	UUID          string
	Topic         string
	Source        string
	PayloadSize   int
	Payload       *string
	Metadata      json.RawMessage
	LastError     string
	RejectedAt    time.Time
}

// RejectedFilter selects rows of outbox_rejected. Zero fields match everything.
type RejectedFilter struct {
	Relay          string
	Offset         int64     // one outbox row (its offset); 0: any
	RejectedAfter  time.Time // inclusive
	RejectedBefore time.Time // exclusive
	// AfterOffset pages a list: only rows of larger offsets.
	AfterOffset int64
}

// RepublishRequest selects rejected rows of one relay to store again in the outbox.
type RepublishRequest struct {
	// Relay is the relay that rejected the rows (as `wmonce outbox rejected` lists it). Required.
	Relay string
	// Offsets are the rejected rows' outbox offsets (their offset column). Give them, or All.
	Offsets []int64
	// All selects every row the relay rejected.
	All bool
	// RemoveMetadata names metadata keys removed from each message before it is stored again:
	// for a row refused because of its metadata, such as a key the broker reserves
	// (_watermill_message_uuid on Kafka). Nothing else is changed.
	RemoveMetadata []string
	// PartitionKeyField is the Writer's Config.PartitionKeyField for rows whose original
	// outbox row retention has deleted (while it is there, its partition_key is kept): the
	// partition_key column Debezium keys records by. Give the producers' value. Default
	// "partition_key".
	PartitionKeyField string
	// DryRun counts what would be republished and changes nothing.
	DryRun bool
}

// RepublishResult says what RepublishRejected did (or, for a dry run, would do).
type RepublishResult struct {
	// Republished counts the rows this call stored again in the outbox and removed from
	// outbox_rejected: len(Offsets).
	Republished int
	// Offsets are those rows' offsets in outbox_rejected, in order: what this call's
	// transaction deleted there (a row another call republished first is not among them).
	Offsets []int64
	// Undecodable lists the offsets of selected rows that are not a message the relay can
	// decode or the Writer can store: republishing them would only reject them again, so they
	// stay in outbox_rejected.
	Undecodable []int64
}

// ErrParkedSettled is returned (wrapped) by ReplayParkedGroup and DiscardParkedGroup when a
// concurrent call settled some of the copies first: the call changes nothing (no copy is
// stored twice), and reports no rows.
var ErrParkedSettled = errors.New("outbox: parked copies were settled by someone else meanwhile")

// ErrSlotPositionNotRegistered is returned by AdvanceSlotPosition for a slot whose position
// RegisterSlotPosition has not registered (or ForgetSlotPosition has removed).
var ErrSlotPositionNotRegistered = errors.New("outbox: the slot's position is not registered")

// ErrSlotMissing is returned by AdvanceSlotPosition when the replication slot does not exist:
// its position then holds outbox retention back for good until ForgetSlotPosition removes it.
var ErrSlotMissing = errors.New("outbox: the replication slot does not exist")

// Set by package outbox (outbox/internal_ops.go).
var (
	// ListRejected lists the rows of outbox_rejected matching f in offset order, for up to
	// limit outbox rows (two relays rejecting one row give two rows of one offset; a page never
	// splits them). withPayload includes payloads and metadata. A schema without the table is
	// an error for which pgtx.IsUndefinedTable is true. It only reads.
	ListRejected func(ctx context.Context, db *sql.DB, schema string, f RejectedFilter, limit int, withPayload bool) ([]RejectedRow, error)
	// RejectedGroups returns the rejected groups of the newest maxRows rejected rows (0: of
	// all), the largest first, and how many rows it left out. It only reads.
	RejectedGroups func(ctx context.Context, db *sql.DB, schema string, maxRows int) (groups []RejectedGroup, left int64, err error)
	// RepublishRejected stores the selected rows of outbox_rejected in the outbox again, as new
	// rows at the end of the outbox (same UUID, payload, metadata less RemoveMetadata, and
	// source; the original's partition key while retention keeps it, else
	// req.PartitionKeyField's), and removes them from outbox_rejected, in one transaction that
	// wakes idle relays. A row refused again is rejected again: fix the cause first. Every
	// relay of the source forwards the new rows after every row committed before them (a later
	// row of the same key is now before it), and a relay that had forwarded the original
	// forwards a copy, which consumers deduplicate by UUID.
	RepublishRejected func(ctx context.Context, db *sql.DB, schema string, req RepublishRequest) (RepublishResult, error)
	// RepublishRejectedGroup stores the group's rows again for their relay, as
	// RepublishRejected does, in one transaction; DiscardRejectedGroup deletes them
	// from outbox_rejected.
	RepublishRejectedGroup func(ctx context.Context, db *sql.DB, schema string, req RejectedGroupRequest) (RejectedGroupResult, error)
	DiscardRejectedGroup   func(ctx context.Context, db *sql.DB, schema string, req RejectedGroupRequest) (RejectedGroupResult, error)
	// ParkedGroups returns the groups of the newest maxRows parked copies (0: of all), the
	// largest first, and how many it left out. It only reads.
	ParkedGroups func(ctx context.Context, db *sql.DB, schema string, maxRows int) (groups []ParkedGroup, left int64, err error)
	// ReplayParkedGroup stores the group's original messages again for the topic they were
	// consumed from; DiscardParkedGroup sets the group aside. Both record what they settled
	// in outbox_parked_settled, so a parked copy is replayed at most once; a copy settled by
	// someone else meanwhile is ErrParkedSettled.
	ReplayParkedGroup  func(ctx context.Context, db *sql.DB, schema string, req ParkedGroupRequest) (ParkedGroupResult, error)
	DiscardParkedGroup func(ctx context.Context, db *sql.DB, schema string, req ParkedGroupRequest) (ParkedGroupResult, error)
	// RelayActive reports whether an instance of the relay named name leads in schema right
	// now (holds its leadership lock, on any connection to this database).
	RelayActive func(ctx context.Context, db *sql.DB, schema, name string) (bool, error)
	// RegisterSlotPosition registers the position of the logical replication slot slot, if it
	// is not registered yet, and reports whether it did; SlotPositions lists the registered
	// slots by name.
	RegisterSlotPosition func(ctx context.Context, db *sql.DB, schema, slot string) (bool, error)
	SlotPositions        func(ctx context.Context, db *sql.DB, schema string) ([]string, error)
	// AdvanceSlotPosition moves the position of slot up to what the slot's reader has
	// confirmed, and reports whether it moved; it trails the slot by up to two calls (call it
	// about as often as Prune: the janitor does, for retention.Config.CDCSlots). Guarantee: the
	// position passes an outbox row only after the slot has confirmed the row's transaction,
	// so the slot will never send it again (for Debezium: its event is in Kafka and its offsets
	// committed). Where it stops: rows committed before the slot existed were never the slot's
	// to send (snapshot.mode=no_data) and count as passed; keep the Relay that forwarded them
	// registered until it has. It fails with ErrSlotPositionNotRegistered or ErrSlotMissing,
	// changing nothing.
	AdvanceSlotPosition func(ctx context.Context, db *sql.DB, schema, slot string) (bool, error)
	// ForgetSlotPosition deletes the position of slot and reports whether it existed. Call it
	// when the slot's reader is retired (cdc.Remove does): a position nobody advances holds
	// every later outbox row back from Prune for good.
	ForgetSlotPosition func(ctx context.Context, db *sql.DB, schema, slot string) (bool, error)
	// CheckParking returns an error wrapping outbox.ErrNotParking when pub is a Writer's
	// Publisher or DBPublisher, which cannot serve as a poison queue's publisher; nil for
	// ParkingPublisher and any other publisher. once.Stack checks its PoisonPublisher with it.
	CheckParking func(pub message.Publisher) error
)

// SlotPositionPrefix starts the name of every slot position in outbox_offsets. A Relay name
// cannot start with it, so a Relay never takes over a slot's position.
const SlotPositionPrefix = "cdc:"

// SlotPositionName is the name in outbox_offsets of the position that follows slot.
func SlotPositionName(slot string) string { return SlotPositionPrefix + slot }

// DueAt returns when msg is due for delivery: its outbox.MetadataDelayedUntil (set by
// delay.Message(msg, delay.For(d)) or Writer.PublishTxAt), rounded up to the microsecond
// PostgreSQL keeps, so that no comparison in the database makes it due early. ok is false when
// msg carries none; err says why a value cannot be read.
func DueAt(md message.Metadata) (due time.Time, ok bool, err error) {
	v := md.Get(delay.DelayedUntilKey)
	if v == "" {
		return time.Time{}, false, nil
	}
	due, err = time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("metadata %s %q is not an RFC 3339 time: %w", delay.DelayedUntilKey, v, err)
	}
	if t := due.Truncate(time.Microsecond); !t.Equal(due) {
		due = t.Add(time.Microsecond)
	}
	return due, true, nil
}
