package pgtest

import (
	"context"
	"database/sql"
	"testing"
)

// LogicalSlot creates a logical replication slot with pgoutput (Debezium's plugin) and drops
// it when t ends: a slot retains WAL on the shared server for as long as it exists. The server
// needs wal_level=logical (e2e/services sets it).
func LogicalSlot(t testing.TB, db *sql.DB) string {
	t.Helper()
	slot := NewName("slot")
	Exec(t, db, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	t.Cleanup(func() {
		if _, err := db.ExecContext(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
			t.Errorf("drop replication slot %s: %v", slot, err)
		}
	})
	return slot
}

// ConfirmSlot advances the logical slot to the current WAL position, as its reader does once it
// has delivered what it read, and returns that position.
func ConfirmSlot(t testing.TB, db *sql.DB, slot string) string {
	t.Helper()
	var lsn string
	if err := db.QueryRowContext(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatalf("read the WAL position: %v", err)
	}
	ConfirmSlotAt(t, db, slot, lsn)
	return lsn
}

// ConfirmSlotAt advances the logical slot to lsn.
func ConfirmSlotAt(t testing.TB, db *sql.DB, slot, lsn string) {
	t.Helper()
	Exec(t, db, `SELECT pg_replication_slot_advance($1, $2::pg_lsn)`, slot, lsn)
}
