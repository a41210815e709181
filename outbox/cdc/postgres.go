package cdc

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/wmonce/watermill-once/internal/outboxops"
	// outbox runs the outboxops functions this package calls (slot positions): linked, it sets them.
	_ "github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/pgtx"
)

// Prepare makes PostgreSQL ready for the connector, idempotently, as a role that owns the
// outbox: it checks wal_level=logical, creates the publication, grants the connector's role read
// access, and registers the slot's position, which outbox.Prune respects from then on.
func Prepare(ctx context.Context, db *sql.DB, config Config) error {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return err
	}
	if err := checkWALLevel(ctx, db); err != nil {
		return err
	}
	table := pgtx.QualifiedName(config.Schema, "outbox")
	if err := createPublication(ctx, db, config.PublicationName, table); err != nil {
		return err
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

// checkWALLevel refuses a server that does not run with wal_level=logical.
func checkWALLevel(ctx context.Context, db *sql.DB) error {
	var level string
	if err := db.QueryRowContext(ctx, `SHOW wal_level`).Scan(&level); err != nil {
		return fmt.Errorf("cdc: read wal_level: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("cdc: PostgreSQL runs with wal_level=%s: Debezium needs wal_level=logical (postgresql.conf, then a restart; e2e/services up postgres sets it)", level)
	}
	return nil
}

// createPublication creates the publication of table's inserts unless it exists (retention's
// deletes are no events, and the router would only warn about them).
func createPublication(ctx context.Context, db *sql.DB, name, table string) error {
	// name is a checked identifier (Config.Validate), safe inside the literal.
	_, err := db.ExecContext(ctx, `DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = '`+name+`') THEN
        CREATE PUBLICATION `+pgtx.QuoteIdentifier(name)+` FOR TABLE `+table+` WITH (publish = 'insert');
    END IF;
END $$`)
	switch {
	case err == nil, pgtx.SQLState(err) == "42710": // duplicate_object: a concurrent Prepare
		return nil
	case pgtx.IsUndefinedTable(err):
		return fmt.Errorf("cdc: table %s is missing: run the migrations first: %w", table, err)
	}
	return fmt.Errorf("cdc: create publication %s: %w", name, err)
}

// AdvancePosition moves the slot's position in outbox_offsets up to what the connector has
// confirmed (trailing it by up to two calls) and reports whether it moved. Guarantee: a row is
// passed only once its event is in Kafka with its offsets committed. Where it stops: rows
// committed before the slot existed count as passed; keep their Relay registered until it has.
func AdvancePosition(ctx context.Context, db *sql.DB, config Config) (bool, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return false, err
	}
	ok, err := outboxops.AdvanceSlotPosition(ctx, db, config.Schema, config.SlotName)
	if err != nil {
		return false, fmt.Errorf("cdc: %w", err)
	}
	return ok, nil
}

// SlotStatus is the connector's replication slot. RetainedBytes, the WAL it keeps from being
// recycled, grows without bound while the connector is down: alert on it.
type SlotStatus struct {
	Exists        bool
	Active        bool
	RetainedBytes int64
	LagBytes      int64
}

// Slot reads the replication slot of config's connector.
func Slot(ctx context.Context, db pgtx.Executor, config Config) (SlotStatus, error) {
	config.setDefaults()
	var s SlotStatus
	// Aggregates over the slot's one row or none, so that a missing slot reads as Exists false.
	err := db.QueryRowContext(ctx, `SELECT count(*) > 0, coalesce(bool_or(active), false),
    coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)), 0)::bigint,
    coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)), 0)::bigint
FROM pg_replication_slots WHERE slot_name = $1`, config.SlotName).Scan(&s.Exists, &s.Active, &s.RetainedBytes, &s.LagBytes)
	if err != nil {
		return SlotStatus{}, fmt.Errorf("cdc: read slot %s: %w", config.SlotName, err)
	}
	return s, nil
}

// dropSlot drops the connector's replication slot, so that it stops retaining WAL (a slot a
// task still reads cannot be dropped). No slot is no error.
func dropSlot(ctx context.Context, db pgtx.Executor, config Config) error {
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

// Remove deletes the connector, then its slot (once its task lets go), the publication and the
// slot's position, which would otherwise hold outbox retention back for good. When switching
// back, start the Relay first: consumers dedupe what both sent.
func Remove(ctx context.Context, client Client, db *sql.DB, config Config) error {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return err
	}
	if err := client.Delete(ctx, config.Name); err != nil {
		return err
	}
	if err := dropReleasedSlot(ctx, db, config); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `DROP PUBLICATION IF EXISTS `+pgtx.QuoteIdentifier(config.PublicationName)); err != nil {
		return fmt.Errorf("cdc: drop publication %s: %w", config.PublicationName, err)
	}
	if _, err := outboxops.ForgetSlotPosition(ctx, db, config.Schema, config.SlotName); err != nil {
		return fmt.Errorf("cdc: %w", err)
	}
	return nil
}

// dropReleasedSlot drops the slot of a deleted connector. Connect stops the deleted connector's
// task asynchronously: until it has, the task may still hold the slot, or even take it again
// after it looked free. So it drops until the slot is gone; a task still reading after
// slotReleaseWait has its walsender ended (the connector no longer exists, nothing reads for it).
func dropReleasedSlot(ctx context.Context, db *sql.DB, config Config) error {
	return retry(ctx, slotReleaseWait, 100*time.Millisecond, func(late bool) (bool, error) {
		err := dropSlot(ctx, db, config)
		if pgtx.SQLState(err) != codeObjectInUse {
			return true, err
		}
		if !late {
			return false, err
		}
		_, endErr := db.ExecContext(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, config.SlotName)
		if endErr != nil {
			return true, fmt.Errorf("cdc: end the reader of slot %s: %w", config.SlotName, endErr)
		}
		return false, fmt.Errorf("cdc: slot %s is still read by a task after the connector was deleted: %w", config.SlotName, err)
	})
}
