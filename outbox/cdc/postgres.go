package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Prepare makes PostgreSQL ready for the connector of config: it checks wal_level=logical,
// creates the publication for the outbox table if it is missing (Debezium's own would need a
// superuser), grants the connector's role USAGE on the schema and SELECT on the outbox, and
// registers the slot's position for outbox retention (outboxops.RegisterSlotPosition; from then on
// outbox.Prune keeps every row until AdvancePosition has seen the slot confirm it). It runs as
// a role that owns the outbox (the migrations' role), is idempotent, and does not create the
// replication slot: the connector creates it at its first start.
func Prepare(ctx context.Context, db *sql.DB, config Config) error {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return err
	}
	var level string
	if err := db.QueryRowContext(ctx, `SHOW wal_level`).Scan(&level); err != nil {
		return fmt.Errorf("cdc: read wal_level: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("cdc: PostgreSQL runs with wal_level=%s: Debezium needs wal_level=logical (postgresql.conf, then a restart; e2e/services up postgres sets it)", level)
	}
	table := pgtx.QualifiedName(config.Schema, "outbox")
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, config.PublicationName).Scan(&exists); err != nil {
		return fmt.Errorf("cdc: look up publication %s: %w", config.PublicationName, err)
	}
	if !exists {
		// Inserts only: retention's deletes are no events, and the router would only warn.
		_, err := db.ExecContext(ctx, `CREATE PUBLICATION `+pgtx.QuoteIdentifier(config.PublicationName)+` FOR TABLE `+table+` WITH (publish = 'insert')`)
		if err != nil && pgtx.SQLState(err) != "42710" { // duplicate_object: a concurrent Prepare
			if pgtx.IsUndefinedTable(err) {
				return fmt.Errorf("cdc: table %s is missing: run the migrations first: %w", table, err)
			}
			return fmt.Errorf("cdc: create publication %s: %w", config.PublicationName, err)
		}
	}
	role := pgtx.QuoteIdentifier(config.User)
	if _, err := db.ExecContext(ctx, `GRANT USAGE ON SCHEMA `+pgtx.QuoteIdentifier(config.Schema)+` TO `+role+`; GRANT SELECT ON `+table+` TO `+role); err != nil {
		return fmt.Errorf("cdc: grant role %s read access to %s (does the role exist? e2e/services creates %s): %w", config.User, table, DefaultReplicationRole, err)
	}
	if _, err := outboxops.RegisterSlotPosition(ctx, db, config.Schema, config.SlotName); err != nil {
		return fmt.Errorf("cdc: %w", err)
	}
	return nil
}

// AdvancePosition moves the slot's position in outbox_offsets up to what the connector has
// confirmed (outbox.AdvanceSlotPosition), so that outbox.Prune deletes the rows Debezium has
// delivered, and reports whether it moved. The retention janitor calls it each round for the
// slots in retention.Config.CDCSlots; wmonce connector status calls it too.
//
// Guarantee: a row is passed only once the slot's confirmed_flush_lsn is past its commit, that
// is, once Debezium has written its event to Kafka and committed its offsets, and the slot will
// never send it again. The position trails the connector by up to two calls. Rows committed
// before the slot existed were never Debezium's (snapshot.mode=no_data) and count as passed:
// keep the Relay that forwarded them registered until it has.
func AdvancePosition(ctx context.Context, db *sql.DB, config Config) (bool, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return false, err
	}
	ok, err := outbox.AdvanceSlotPosition(ctx, db, config.Schema, config.SlotName)
	if err != nil {
		return false, fmt.Errorf("cdc: %w", err)
	}
	return ok, nil
}

// SlotStatus is the replication slot of a connector, as PostgreSQL reports it.
type SlotStatus struct {
	Exists bool
	// Active: a connector task is reading the slot now.
	Active bool
	// RetainedBytes is the WAL the slot keeps from being recycled (current WAL position minus
	// the slot's restart_lsn): it grows while the connector is down, without bound. Alert on it.
	RetainedBytes int64
	// LagBytes is the WAL written since the position the connector confirmed.
	LagBytes int64
}

// Slot reads the replication slot of config's connector.
func Slot(ctx context.Context, db pgtx.Executor, config Config) (SlotStatus, error) {
	config.setDefaults()
	var s SlotStatus
	err := db.QueryRowContext(ctx, `SELECT active,
    coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint,
    coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
FROM pg_replication_slots WHERE slot_name = $1`, config.SlotName).Scan(&s.Active, &s.RetainedBytes, &s.LagBytes)
	if errors.Is(err, sql.ErrNoRows) {
		return SlotStatus{}, nil
	}
	if err != nil {
		return SlotStatus{}, fmt.Errorf("cdc: read slot %s: %w", config.SlotName, err)
	}
	s.Exists = true
	return s, nil
}

// DropSlot drops the connector's replication slot, so that it stops retaining WAL; call it
// after the connector is deleted (a slot a task still reads cannot be dropped: the error says
// so). No slot is no error. The publication stays (Prepare reuses it).
func DropSlot(ctx context.Context, db pgtx.Executor, config Config) error {
	config.setDefaults()
	_, err := db.ExecContext(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, config.SlotName)
	if err != nil {
		return fmt.Errorf("cdc: drop slot %s (a connector task still reading it? delete the connector first): %w", config.SlotName, err)
	}
	return nil
}

// slotReleaseWait is how long Remove lets a deleted connector's task let go of its slot before
// ending its walsender; codeObjectInUse is the SQLSTATE of dropping an active slot.
const (
	slotReleaseWait = 10 * time.Second
	codeObjectInUse = "55006"
)

// Remove deletes the connector of config from Connect, waits (until ctx ends) for its task to
// let go of the replication slot (ending its walsender if it has not after slotReleaseWait), drops the slot (so that it stops retaining WAL), the
// publication and the slot's position in outbox_offsets (which would otherwise hold outbox
// retention back for good). Events committed after the connector stopped are no longer read by it: start
// the Relay before removing the connector when switching back (the Relay forwards every row of
// its position on; the consumer dedupes what both sent).
func Remove(ctx context.Context, client Client, db *sql.DB, config Config) error {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return err
	}
	if err := client.Delete(ctx, config.Name); err != nil {
		return err
	}
	// Connect stops the deleted connector's task asynchronously: until it has, the task may
	// still hold the slot, or even take it again after it looked free. Drop until the slot is
	// gone; a task still reading after slotReleaseWait has its walsender ended (the connector
	// no longer exists, nothing reads for it).
	deadline := time.Now().Add(slotReleaseWait)
	for {
		err := DropSlot(ctx, db, config)
		if err == nil {
			break
		}
		if pgtx.SQLState(err) != codeObjectInUse {
			return err
		}
		if time.Now().After(deadline) {
			if _, err := db.ExecContext(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, config.SlotName); err != nil {
				return fmt.Errorf("cdc: end the reader of slot %s: %w", config.SlotName, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cdc: slot %s is still read by a task after the connector was deleted: %w", config.SlotName, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := db.ExecContext(ctx, `DROP PUBLICATION IF EXISTS `+pgtx.QuoteIdentifier(config.PublicationName)); err != nil {
		return fmt.Errorf("cdc: drop publication %s: %w", config.PublicationName, err)
	}
	if _, err := outbox.ForgetSlotPosition(ctx, db, config.Schema, config.SlotName); err != nil {
		return fmt.Errorf("cdc: %w", err)
	}
	return nil
}
