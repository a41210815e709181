package wmonce_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A table is written only by its owner (ARCHITECTURE.md's "owns (tables)" column): any other
// package calls the owner's exported operation. And the outbox table has one writer inside its
// owner too: the statements of insertSQL, run by Writer.store, so that every row carries every
// column the Relay and Debezium read (a second INSERT left out migration 013's columns once,
// in RepublishRejected, and Debezium's task failed on the row). One scan checks both: it finds
// every INSERT, UPDATE and DELETE in the library's Go code (tests, e2e, examples and the test
// machinery of ARCHITECTURE.md's layer 6 left out; they write rows on purpose, a legacy
// writer's outbox row for instance) and in the SQL files, and the table each one writes.

// oneOutboxWriter is the one function allowed to hold an INSERT into the outbox table.
const oneOutboxWriter = "outbox/writer.go:insertSQL"

func TestATableIsWrittenOnlyByItsOwner(t *testing.T) {
	t.Parallel()
	owners := tableOwners(t)
	require.Equal(t, "outbox", owners["outbox"], "ARCHITECTURE.md's Packages table lost the outbox's owner")
	require.Equal(t, "inbox", owners["inbox_paused"], "ARCHITECTURE.md's Packages table lost the inbox's tables")
	var found []string
	for _, w := range tableWrites(t, owners) {
		switch {
		case w.table == "outbox" && w.verb == "insert" && w.where != oneOutboxWriter:
			found = append(found, w.String()+": only "+oneOutboxWriter+" inserts into the outbox: store through an outbox.Writer")
		case w.pkg != "" && w.pkg != owners[w.table]:
			found = append(found, w.String()+": "+w.table+" belongs to "+owners[w.table]+": call its exported operation")
		}
	}
	require.Empty(t, found, "a table written by a second writer")
}

// A second writer is found, in every form the code uses for a table: a name in the SQL, a
// pgtx.QualifiedName expression, a variable, field or method set from one, and fmt.Sprintf.
func TestTheOwnerScanFindsASecondWriter(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "ops", "rogue")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rogue.go"), []byte(`package rogue

import "fmt"

type o struct{ schema, held string }

func (x o) pausedTable() string { return pgtx.QualifiedName(x.schema, "inbox_paused") }

func writes(x o, schema string) []string {
	x.held = pgtx.QualifiedName(schema, "outbox_held")
	return []string{
		"INSERT INTO {{schema}}.processed_messages (consumer) VALUES ($1)",
		`+"`"+`UPDATE `+"`"+` + pgtx.QualifiedName(schema, "inbox") + `+"`"+` SET status = 'DONE'`+"`"+`,
		"DELETE FROM " + x.pausedTable(),
		"DELETE FROM " + x.held + " WHERE topic = $1",
		fmt.Sprintf("INSERT INTO %s (x) VALUES (1)", pgtx.QualifiedName(schema, "outbox")),
		"SELECT 1 FROM " + pgtx.QualifiedName(schema, "inbox") + " FOR UPDATE SKIP LOCKED",
	}
}
`), 0o644))
	var got []string
	for _, w := range goWrites(t, filepath.Dir(filepath.Dir(dir)), "ops/rogue", map[string]string{
		"processed_messages": "middleware/once", "inbox": "inbox", "inbox_paused": "inbox", "outbox_held": "outbox", "outbox": "outbox",
	}) {
		got = append(got, w.verb+" "+w.table)
	}
	require.ElementsMatch(t, []string{"insert processed_messages", "update inbox", "delete inbox_paused", "delete outbox_held", "insert outbox"}, got)
}

// tableOwners reads ARCHITECTURE.md's Packages table: each table named (in backquotes, before
// any parenthesis) in the "owns (tables)" column, and its package.
func tableOwners(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("ARCHITECTURE.md")
	require.NoError(t, err)
	owners := map[string]string{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Packages"
		case in && strings.HasPrefix(line, "| `"):
			cols := strings.Split(line, "|")
			pkg := strings.Trim(strings.Fields(cols[1])[0], "`")
			owns := cols[len(cols)-2]
			owns, _, _ = strings.Cut(owns, "(")
			for _, m := range backquoted.FindAllStringSubmatch(owns, -1) {
				require.NotContains(t, owners, m[1], "ARCHITECTURE.md names two owners of %s", m[1])
				owners[m[1]] = pkg
			}
		}
	}
	require.NotEmpty(t, owners, "no owned tables found under ARCHITECTURE.md's ## Packages")
	return owners
}

var backquoted = regexp.MustCompile("`([a-z_]+)`")

// testMachinery is the folders of ARCHITECTURE.md's layer 6 (test and demo machinery: only tests
// and layer 7 import it), which write rows on purpose as tests do.
func testMachinery(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("ARCHITECTURE.md")
	require.NoError(t, err)
	dirs := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if cols := strings.Split(line, "|"); strings.HasPrefix(line, "| 6 |") && len(cols) > 2 {
			for _, m := range packagePath.FindAllStringSubmatch(cols[2], -1) {
				dirs[m[1]] = true
			}
		}
	}
	require.Contains(t, dirs, "internal/pgtest", "ARCHITECTURE.md's Import layers lost layer 6 (the test machinery)")
	return dirs
}

var packagePath = regexp.MustCompile("`(internal/[a-z/]+)`")

// write is one statement that writes a table: in the package pkg (a folder of the module;
// "" for a SQL file), at where (file:function).
type write struct {
	pkg, where, verb, table, sql string
}

func (w write) String() string { return w.where + ": " + strings.Join(strings.Fields(w.sql), " ") }

// tableWrites are the writes of owned tables in the library's Go code and in the SQL files.
func tableWrites(t *testing.T, owners map[string]string) []write {
	t.Helper()
	root, err := filepath.Abs(".")
	require.NoError(t, err)
	var out []write
	dirs := map[string]bool{}
	machinery := testMachinery(t)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules" || rel == "e2e" || rel == "examples" || machinery[rel]) {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, "_test.go"):
		case strings.HasSuffix(path, ".go"):
			dirs[filepath.ToSlash(filepath.Dir(rel))] = true
		case strings.HasSuffix(path, ".sql"): // migrations: only the outbox's one-insert rule applies
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			for _, m := range writeTo.FindAllStringSubmatch(string(b), -1) {
				out = append(out, newWrites("", rel, m, nil, owners)...)
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.True(t, dirs["outbox"] && dirs["inbox"], "the walk missed the outbox and inbox packages")
	for dir := range dirs {
		out = append(out, goWrites(t, root, dir, owners)...)
	}
	return out
}

// writeTo finds the table of an INSERT, UPDATE or DELETE in rendered SQL: a name, or ⟨an
// expression⟩.
var writeTo = regexp.MustCompile(`(?is)\b(insert\s+into|update|delete\s+from)\s+(⟨[^⟩]*⟩|[A-Za-z_{}".]+)`)

// tableName is a table written as a name in SQL text, maybe schema-qualified.
var tableName = regexp.MustCompile(`^(?:(?:\{\{schema\}\}|"?\w+"?)\.)?"?(\w+)"?$`)

// newWrites are the writes of match m (of writeTo), one for each owned table its table
// expression may be; names maps the package's variables, fields and functions to the tables
// they are set from.
func newWrites(pkg, where string, m []string, names map[string][]string, owners map[string]string) []write {
	verb := strings.ToLower(strings.Fields(m[1])[0])
	var out []write
	for _, table := range resolve(m[2], names) {
		if _, ok := owners[table]; ok {
			out = append(out, write{pkg: pkg, where: where, verb: verb, table: table, sql: m[0]})
		}
	}
	return out
}

// resolve returns the tables a table expression may be: the name; for ⟨expr⟩ each literal
// "table" in it, else the tables its last name (variable, field or method) is set from.
func resolve(table string, names map[string][]string) []string {
	if !strings.HasPrefix(table, "⟨") {
		if m := tableName.FindStringSubmatch(table); m != nil {
			return []string{m[1]}
		}
		return nil
	}
	expr := strings.TrimSuffix(strings.TrimPrefix(table, "⟨"), "⟩")
	if lits := literals.FindAllStringSubmatch(expr, -1); len(lits) > 0 {
		var out []string
		for _, l := range lits {
			out = append(out, l[1])
		}
		return out
	}
	last := strings.TrimSuffix(expr, "()")
	return names[last[strings.LastIndex(last, ".")+1:]]
}

var literals = regexp.MustCompile(`"(\w+)"`)

// goWrites returns the writes of owned tables in the Go files (tests left out) of the folder
// rel. SQL built by concatenation or fmt.Sprintf is rendered with ⟨expr⟩ for each non-literal
// part.
func goWrites(t *testing.T, root, rel string, owners map[string]string) []write {
	t.Helper()
	fset := token.NewFileSet()
	pkgs := parseDir(t, fset, filepath.Join(root, rel))
	src := map[string][]byte{}
	text := func(n ast.Node) string {
		f := fset.File(n.Pos())
		if src[f.Name()] == nil {
			src[f.Name()], _ = os.ReadFile(f.Name())
		}
		return string(src[f.Name()][f.Offset(n.Pos()):f.Offset(n.End())])
	}
	var out []write
	for _, pkg := range pkgs {
		names := tableNames(pkg, text)
		for name, file := range pkg {
			where := rel + "/" + filepath.Base(name)
			for _, decl := range file.Decls {
				fn := "" // package-level declarations have no function
				if f, ok := decl.(*ast.FuncDecl); ok {
					fn = f.Name.Name
				}
				ast.Inspect(decl, func(n ast.Node) bool {
					e, ok := n.(ast.Expr)
					if !ok {
						return true
					}
					sql, ok := render(e, text)
					if !ok {
						return true
					}
					for _, m := range writeTo.FindAllStringSubmatch(sql, -1) {
						out = append(out, newWrites(rel, where+":"+fn, m, names, owners)...)
					}
					return false // its parts are rendered with it
				})
			}
		}
	}
	return out
}

// render renders SQL text: a string literal, a concatenation that holds one, or fmt.Sprintf
// of a literal format (each %s, %v or %q replaced by its argument). ok is false for any other
// expression.
func render(e ast.Expr, text func(ast.Node) string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		x, okX := render(e.X, text)
		y, okY := render(e.Y, text)
		if e.Op != token.ADD || !okX && !okY {
			return "", false
		}
		return part(x, okX, e.X, text) + part(y, okY, e.Y, text), true
	case *ast.ParenExpr:
		return render(e.X, text)
	case *ast.CallExpr:
		if text(e.Fun) != "fmt.Sprintf" || len(e.Args) == 0 {
			return "", false
		}
		format, ok := render(e.Args[0], text)
		if !ok {
			return "", false
		}
		args := e.Args[1:]
		return verbs.ReplaceAllStringFunc(format, func(string) string {
			if len(args) == 0 {
				return "⟨⟩"
			}
			a := args[0]
			args = args[1:]
			s, ok := render(a, text)
			return part(s, ok, a, text)
		}), true
	}
	return "", false
}

var verbs = regexp.MustCompile(`%[sqv]`)

func part(s string, ok bool, e ast.Expr, text func(ast.Node) string) string {
	if ok {
		return s
	}
	return "⟨" + text(e) + "⟩"
}

// parseDir parses the non-test Go files of dir, grouped by package name, each package's files
// by path.
func parseDir(t *testing.T, fset *token.FileSet, dir string) map[string]map[string]*ast.File {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	pkgs := map[string]map[string]*ast.File{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		require.NoError(t, err)
		if pkgs[f.Name.Name] == nil {
			pkgs[f.Name.Name] = map[string]*ast.File{}
		}
		pkgs[f.Name.Name][path] = f
	}
	return pkgs
}

// tableNames maps the names (variables, fields, the last part of a selector, functions and
// methods) the package sets from an expression holding a literal "table" to those tables.
func tableNames(pkg map[string]*ast.File, text func(ast.Node) string) map[string][]string {
	names := map[string][]string{}
	add := func(name string, e ast.Node) {
		for _, l := range literals.FindAllStringSubmatch(text(e), -1) {
			if name != "" && !slices.Contains(names[name], l[1]) {
				names[name] = append(names[name], l[1])
			}
		}
	}
	name := func(e ast.Expr) string {
		switch e := e.(type) {
		case *ast.Ident:
			return e.Name
		case *ast.SelectorExpr:
			return e.Sel.Name
		}
		return ""
	}
	for _, f := range pkg {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for i, lhs := range n.Lhs {
					if i < len(n.Rhs) {
						add(name(lhs), n.Rhs[i])
					}
				}
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if i < len(n.Values) {
						add(id.Name, n.Values[i])
					}
				}
			case *ast.KeyValueExpr:
				add(name(n.Key), n.Value)
			case *ast.FuncDecl: // a function that returns a table's name: func (o *Ops) pausedTable() string
				if n.Body != nil && len(n.Body.List) == 1 {
					if r, ok := n.Body.List[0].(*ast.ReturnStmt); ok && len(r.Results) == 1 {
						add(n.Name.Name, r.Results[0])
					}
				}
			}
			return true
		})
	}
	return names
}
