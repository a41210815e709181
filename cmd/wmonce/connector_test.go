package main

import (
	"cmp"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/outbox/cdc"
	"github.com/wmonce/watermill-once/pgtx"
)

// connector config prints the configuration without a database or a Connect cluster, and
// refuses bad input as a usage error.
func TestConnectorConfigNeedsNothingRunning(t *testing.T) {
	r := wmonceRaw(t, "-schema", "shop", "connector", "config", "-database-url", "postgres://app@db.internal:5432/prod")
	require.Equal(t, 0, r.code, r.stderr)
	var out struct {
		Name   string            `json:"name"`
		Config map[string]string `json:"config"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Equal(t, "wmonce-outbox-shop", out.Name)
	require.Equal(t, "required", out.Config["exactly.once.support"])
	require.Equal(t, "db.internal", out.Config["database.hostname"])

	// A password of the URL is masked unless asked for; a reference is printed as it is.
	withPassword := []string{"connector", "config", "-database-url", "postgres://app:s3cret@db.internal:5432/prod"}
	r = wmonceRaw(t, withPassword...)
	require.Equal(t, 0, r.code, r.stderr)
	require.NotContains(t, r.stdout, "s3cret")
	require.Contains(t, r.stderr, "-show-password")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Equal(t, maskedPassword, out.Config["database.password"])
	r = wmonceRaw(t, append(withPassword, "-show-password")...)
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Equal(t, "s3cret", out.Config["database.password"])
	ref := "${env:WMONCE_CDC_PASSWORD}"
	r = wmonceRaw(t, "connector", "config", "-database-url", "postgres://app@db.internal:5432/prod", "-password-ref", ref)
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
	require.Equal(t, ref, out.Config["database.password"])

	r = wmonceRaw(t, "connector", "config", "-connector-database-url", "mysql://x")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "is not postgres://user@host:port/database")
}

// apply registers a connector that runs, status says so (exit 0) with its slot, delete removes
// the connector, its slot and publication, and status then fails.
func TestConnectorApplyStatusDelete(t *testing.T) {
	brokertest.SkipShort(t, "a Kafka Connect cluster with Debezium (e2e/services up connect)")
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	url := cmp.Or(os.Getenv("CONNECT_URL"), cdc.DefaultConnectURL)
	r := runCLI(t, schema, "connector", "apply", "-connect-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	cfg := cdc.Config{Schema: schema, DatabaseURL: pgtest.URL(), User: cdc.DefaultReplicationRole}.WithDefaults()
	position := `SELECT count(*) FROM ` + pgtx.QualifiedName(schema, "outbox_offsets") + ` WHERE consumer_group = $1`
	require.Equal(t, 1, pgtest.Count(t, db, position, outboxops.SlotPositionName(cfg.SlotName)), "apply registers the slot's position for retention")
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = cdc.Remove(t.Context(), cdc.Client{URL: url}, db, cfg)
		}
	})
	testwait.UntilWithin(t, testwait.Timeout*4, "connector status to report a running connector", func() bool {
		r = runCLI(t, schema, "-json", "connector", "status", "-connect-url", url)
		return r.code == 0
	})
	var st connectorState
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.True(t, st.Slot.Exists)
	require.Equal(t, cfg.Name, st.Name)

	r = runCLI(t, schema, "connector", "delete", "-connect-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	deleted = true
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, cfg.SlotName))
	require.Zero(t, pgtest.Count(t, db, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, cfg.PublicationName))
	require.Zero(t, pgtest.Count(t, db, position, outboxops.SlotPositionName(cfg.SlotName)), "a deleted connector's position no longer holds retention back")
	// Connect's status topic may report the deleted connector for a moment.
	testwait.Until(t, "connector status to fail once the connector is gone", func() bool {
		return runCLI(t, schema, "connector", "status", "-connect-url", url).code == exitFailure
	})
}
