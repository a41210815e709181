package migrate

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/wmonce/watermill-once/pgtx"
)

//go:embed sql/*.sql
var migrationFS embed.FS

// Migration is one numbered step with its up and down SQL, the schema placeholder unresolved.
type Migration struct {
	Version int
	Name    string
	up      string
	down    string
}

// Checksum is the hex SHA-256 of the up SQL as embedded: what the version table records.
func (m Migration) Checksum() string {
	sum := sha256.Sum256([]byte(m.up))
	return hex.EncodeToString(sum[:])
}

var filePattern = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.(up|down)\.sql$`)

// All returns every embedded migration, ordered by version.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFS, "sql")
	if err != nil {
		return nil, fmt.Errorf("migrate: read embedded migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		if err := addFile(byVersion, e.Name()); err != nil {
			return nil, err
		}
	}
	return inOrder(byVersion)
}

// addFile adds the embedded file name (NNN_name.up.sql or .down.sql) to its migration.
func addFile(byVersion map[int]*Migration, name string) error {
	m := filePattern.FindStringSubmatch(name)
	if m == nil {
		return fmt.Errorf("migrate: embedded file %q is not named NNN_name.(up|down).sql", name)
	}
	version, _ := strconv.Atoi(m[1])
	body, err := migrationFS.ReadFile("sql/" + name)
	if err != nil {
		return fmt.Errorf("migrate: read %s: %w", name, err)
	}
	mig := byVersion[version]
	if mig == nil {
		mig = &Migration{Version: version, Name: m[2]}
		byVersion[version] = mig
	}
	// Two changes made side by side can both take the next number: say so, rather than
	// pair one's up file with the other's down file.
	if mig.Name != m[2] {
		return fmt.Errorf("migrate: version %03d is taken twice, by %q and %q: renumber one", version, mig.Name, m[2])
	}
	if m[3] == "up" {
		mig.up = string(body)
	} else {
		mig.down = string(body)
	}
	return nil
}

// inOrder returns the migrations ordered by version, refusing one without both files or a
// gap in the numbers.
func inOrder(byVersion map[int]*Migration) ([]Migration, error) {
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migrate: migration %03d_%s lacks its up or down file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migrate: migration versions must be 1..N without gaps; found %03d at position %d", m.Version, i+1)
		}
	}
	return out, nil
}

// Latest returns the highest embedded version.
func Latest() int {
	all, err := All()
	if err != nil || len(all) == 0 {
		return 0
	}
	return all[len(all)-1].Version
}

// render substitutes the quoted schema name into a migration body.
func render(body, schema string) string {
	return strings.ReplaceAll(body, "{{schema}}", pgtx.QuoteIdentifier(schema))
}
