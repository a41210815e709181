package wmonce_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOutboxAndInboxExportWhatUsersCall holds issue 36 item 5 for the two largest public
// packages: what only the library's own tools call lives in internal/outboxops and
// internal/inboxops, so no name those packages declare may be exported by outbox or inbox
// again, and a Default… constant whose only use is a field default is not exported (the
// field's doc states the value).
func TestOutboxAndInboxExportWhatUsersCall(t *testing.T) {
	for owner, internal := range map[string]string{"outbox": "internal/outboxops", "inbox": "internal/inboxops"} {
		internalNames := map[string]bool{}
		for _, n := range exportedNames(t, internal) {
			internalNames[n] = true
		}
		if len(internalNames) == 0 {
			t.Fatalf("%s declares no exported name: the scan is broken", internal)
		}
		public := exportedNames(t, owner)
		if len(public) == 0 {
			t.Fatalf("%s declares no exported name: the scan is broken", owner)
		}
		for _, n := range public {
			if internalNames[strings.TrimPrefix(n, "Ops.")] && !sharedSentinels[owner+"."+n] {
				t.Errorf("%s exports %s, which %s holds for the library's tools", owner, n, internal)
			}
			if strings.HasPrefix(n, "const Default") {
				t.Errorf("%s exports %s: state the default in the field's doc instead", owner, strings.TrimPrefix(n, "const "))
			}
		}
	}
}

// sharedSentinels are errors both a public package and its tools' internal package name: one
// value, which users match with errors.Is on the public package's errors.
var sharedSentinels = map[string]bool{
	"outbox.ErrPositionsMoved": true, // returned by Prune and RelayOnce after a restore
}

// exportedNames lists the exported top-level names of the package in dir (its non-test files):
// types, funcs and vars by name, constants as "const Name", methods as "Recv.Name".
func exportedNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv != nil {
					recv := d.Recv.List[0].Type
					if s, ok := recv.(*ast.StarExpr); ok {
						recv = s.X
					}
					if id, ok := recv.(*ast.Ident); ok && id.IsExported() {
						names = append(names, id.Name+"."+d.Name.Name)
					}
					continue
				}
				names = append(names, d.Name.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if !n.IsExported() {
								continue
							}
							if d.Tok == token.CONST {
								names = append(names, "const "+n.Name)
							} else {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
		}
	}
	return names
}
