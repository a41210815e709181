package migrate

import (
	"fmt"
	"strings"

	"github.com/wmonce/watermill-once/pgtx"
)

// Print returns the SQL of the migrations between two versions for teams that apply SQL with
// their own tools: for DirectionUp the migrations after fromVersion up to toVersion (0 = latest),
// preceded by CREATE SCHEMA IF NOT EXISTS; for DirectionDown those from fromVersion down to
// above toVersion, newest first. No version table is written by the printed SQL.
func Print(schema string, direction Direction, fromVersion, toVersion int) (string, error) {
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	all, err := All()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	switch direction {
	case DirectionUp:
		if toVersion == 0 {
			toVersion = all[len(all)-1].Version
		}
		fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", pgtx.QuoteIdentifier(schema))
		for _, m := range all {
			if m.Version > fromVersion && m.Version <= toVersion {
				fmt.Fprintf(&b, "\n-- %03d_%s (up)\n%s", m.Version, m.Name, render(m.up, schema))
			}
		}
	case DirectionDown:
		for i := len(all) - 1; i >= 0; i-- {
			m := all[i]
			if m.Version <= fromVersion && m.Version > toVersion {
				fmt.Fprintf(&b, "\n-- %03d_%s (down)\n%s", m.Version, m.Name, render(m.down, schema))
			}
		}
	default:
		return "", fmt.Errorf("migrate: direction must be %q or %q, got %q", DirectionUp, DirectionDown, direction)
	}
	return b.String(), nil
}
