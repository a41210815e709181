package outbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The outbox table has one writer: the statements of insertSQL, run by Writer.store. Every
// other path (republishing, parking, replaying parked copies) stores through a Writer, so that
// each row carries every column the Relay and Debezium read. A second INSERT left out
// migration 013's columns once (RepublishRejected), and Debezium's task failed on the row.

// oneWriter is the one function allowed to hold an INSERT into the outbox table.
const oneWriter = "outbox/writer.go:insertSQL"

// insertInto finds the table of an INSERT in rendered SQL: a name, or ⟨an expression⟩.
var insertInto = regexp.MustCompile(`(?is)\binsert\s+into\s+(⟨[^⟩]*⟩|[A-Za-z_{}".]+)`)

// outboxName is the outbox table written as a name in SQL text.
var outboxName = regexp.MustCompile(`^((\{\{schema\}\}|"?\w+"?)\.)?"?outbox"?$`)

func TestOnlyTheWriterInsertsIntoTheOutbox(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	var found []string
	dirs := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "testdata" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, "_test.go"): // tests store legacy and foreign rows on purpose
			return nil
		case strings.HasSuffix(path, ".go"):
			dirs[filepath.Dir(rel)] = true
		case strings.HasSuffix(path, ".sql"):
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			for _, m := range insertInto.FindAllStringSubmatch(string(b), -1) {
				if outboxName.MatchString(m[1]) {
					found = append(found, rel+": "+m[0])
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, dirs["outbox"], "the walk missed package outbox")
	for dir := range dirs {
		found = append(found, outboxInsertsInGo(t, root, dir)...)
	}
	require.Empty(t, found, "only %s inserts into the outbox table: store through an outbox.Writer (its store path) instead", oneWriter)
}

// outboxInsertsInGo returns the INSERTs into the outbox table in the Go files (tests left
// out) of the folder rel outside oneWriter. SQL built by concatenation is rendered with ⟨expr⟩ for each non-literal part; the
// table is the outbox when it is written as a name, when its expression holds the literal
// "outbox", or when it is a variable or field that some assignment of the package sets from an
// expression holding that literal.
func outboxInsertsInGo(t *testing.T, root, rel string) []string {
	t.Helper()
	fset := token.NewFileSet()
	dir := filepath.Join(root, rel)
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	require.NoError(t, err)
	src := map[string][]byte{}
	text := func(n ast.Node) string {
		f := fset.File(n.Pos())
		if src[f.Name()] == nil {
			src[f.Name()], _ = os.ReadFile(f.Name())
		}
		return string(src[f.Name()][f.Offset(n.Pos()):f.Offset(n.End())])
	}
	var out []string
	for _, pkg := range pkgs {
		tables := outboxTableNames(pkg, text)
		for name, file := range pkg.Files {
			where := filepath.ToSlash(filepath.Join(rel, filepath.Base(name)))
			for _, decl := range file.Decls {
				fn := "" // package-level declarations have no function
				if f, ok := decl.(*ast.FuncDecl); ok {
					fn = f.Name.Name
				}
				ast.Inspect(decl, func(n ast.Node) bool {
					e, ok := n.(ast.Expr)
					if !ok || !isSQLText(e) {
						return true
					}
					sql := render(e, text)
					for _, m := range insertInto.FindAllStringSubmatch(sql, -1) {
						if isOutbox(m[1], tables) && where+":"+fn != oneWriter {
							out = append(out, where+":"+fn+": "+m[0])
						}
					}
					return false // its parts are rendered with it
				})
			}
		}
	}
	return out
}

// isSQLText is true for a string literal or a concatenation that holds one.
func isSQLText(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING
	case *ast.BinaryExpr:
		return e.Op == token.ADD && (isSQLText(e.X) || isSQLText(e.Y))
	case *ast.ParenExpr:
		return isSQLText(e.X)
	}
	return false
}

func render(e ast.Expr, text func(ast.Node) string) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			s, err := strconv.Unquote(e.Value)
			if err == nil {
				return s
			}
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return render(e.X, text) + render(e.Y, text)
		}
	case *ast.ParenExpr:
		return render(e.X, text)
	}
	return "⟨" + text(e) + "⟩"
}

// outboxTableNames are the names (variables, fields, the last part of a selector) the package
// assigns from an expression holding the literal "outbox".
func outboxTableNames(pkg *ast.Package, text func(ast.Node) string) map[string]bool {
	names := map[string]bool{}
	holds := func(e ast.Expr) bool { return strings.Contains(text(e), `"outbox"`) }
	name := func(e ast.Expr) string {
		switch e := e.(type) {
		case *ast.Ident:
			return e.Name
		case *ast.SelectorExpr:
			return e.Sel.Name
		}
		return ""
	}
	for _, f := range pkg.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for i, lhs := range n.Lhs {
					if i < len(n.Rhs) && holds(n.Rhs[i]) {
						names[name(lhs)] = true
					}
				}
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if i < len(n.Values) && holds(n.Values[i]) {
						names[id.Name] = true
					}
				}
			case *ast.KeyValueExpr:
				if holds(n.Value) {
					names[name(n.Key)] = true
				}
			}
			return true
		})
	}
	delete(names, "")
	return names
}

// isOutbox says whether the table of an INSERT, as insertInto found it, is the outbox.
func isOutbox(table string, names map[string]bool) bool {
	if !strings.HasPrefix(table, "⟨") {
		return outboxName.MatchString(table)
	}
	expr := strings.TrimSuffix(strings.TrimPrefix(table, "⟨"), "⟩")
	if strings.Contains(expr, `"outbox"`) {
		return true
	}
	last := expr[strings.LastIndex(expr, ".")+1:]
	return names[last]
}
