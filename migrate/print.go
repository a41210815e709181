package migrate

import (
	"fmt"
	"strings"

	"github.com/wmonce/watermill-once/pgtx"
)

// Print returns the SQL of the migrations after fromVersion up to toVersion (0: latest), or for
// DirectionDown from fromVersion down to above toVersion, for teams that apply SQL with their
// own tools. It writes the version rows as Migrate does; run it in one transaction
// (psql -1 -v ON_ERROR_STOP=1).
func Print(schema string, direction Direction, fromVersion, toVersion int) (string, error) {
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	all, err := All()
	if err != nil {
		return "", err
	}
	versions := pgtx.QualifiedName(schema, "schema_migrations")
	var b strings.Builder
	switch direction {
	case DirectionUp:
		if toVersion == 0 {
			toVersion = all[len(all)-1].Version
		}
		fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", pgtx.QuoteIdentifier(schema))
		// The version table as Migrate creates it; one an earlier release's Migrate created may
		// lack the checksum column (added here without the notice ADD COLUMN IF NOT EXISTS prints).
		fmt.Fprintf(&b, "%s;\n", versionTableDDL(schema))
		fmt.Fprintf(&b, "DO $$ BEGIN\n    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '%s'::regclass AND attname = 'checksum' AND NOT attisdropped) THEN\n"+
			"        ALTER TABLE %s ADD COLUMN checksum text;\n    END IF;\nEND $$;\n", versions, versions)
		for _, m := range all {
			if m.Version > fromVersion && m.Version <= toVersion {
				fmt.Fprintf(&b, "\n-- %03d_%s (up)\n%s", m.Version, m.Name, render(m.up, schema))
				fmt.Fprintf(&b, "INSERT INTO %s (version, name, checksum) VALUES (%d, '%s', '%s');\n", versions, m.Version, m.Name, m.Checksum())
			}
		}
	case DirectionDown:
		for i := len(all) - 1; i >= 0; i-- {
			m := all[i]
			if m.Version <= fromVersion && m.Version > toVersion {
				fmt.Fprintf(&b, "\n-- %03d_%s (down)\n%s", m.Version, m.Name, render(m.down, schema))
				fmt.Fprintf(&b, "DELETE FROM %s WHERE version = %d;\n", versions, m.Version)
			}
		}
	default:
		return "", fmt.Errorf("migrate: direction must be %q or %q, got %q", DirectionUp, DirectionDown, direction)
	}
	return b.String(), nil
}
