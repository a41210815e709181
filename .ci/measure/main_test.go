package main

import (
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A small checkout whose every count is known: what the library is, what is public, what is
// exported, and the complexity of one function by gocyclo's rule.
var fixture = map[string]string{
	"go.mod": "module example.com/m\n\ngo 1.22\n\nrequire a.example/x v1.0.0\n\nrequire (\n\tb.example/y v1.0.0 // indirect\n\tc.example/z v1.0.0\n)\n",
	"m.go": `package m

// DefaultSize is a default.
const DefaultSize, Other, hidden = 1, 2, 3

// T is exported.
type T struct {
	Name, Kind string
	Embedded
	*Other2
	private int
}

type Embedded struct{}
type Other2 struct{}
type unexported struct{ Field int }

func (T) Method()          {}
func (unexported) Method() {}
func helper()              {}

// Decide has complexity 1 + if + for + range + 2 cases + 1 select case + && + || + an if in a
// func literal = 10.
func Decide(a, b bool, xs []int, c chan int) {
	if a && b || !a {
	}
	for i := 0; i < 1; i++ {
	}
	for range xs {
	}
	switch {
	case a:
	case b:
	default:
	}
	select {
	case <-c:
	default:
	}
	_ = func() {
		if b {
		}
	}
}
`,
	"m_test.go":           "package m\n\nfunc TestX() {}\n",
	"internal/in/in.go":   "package in\n\nfunc Exported() {}\n",
	"internal/tm/tm.go":   "package tm\n\nfunc Machinery() {}\n",
	"cmd/tool/main.go":    "package main\n\nfunc main() {}\n",
	"e2e/suite/suite.go":  "package suite\n\nfunc Suite() {}\n",
	"_skipped/s.go":       "package s\n",
	"testdata/t.go":       "package t\n",
	"nested/go.mod":       "module example.com/m/nested\n",
	"nested/n.go":         "package n\n",
	"ARCHITECTURE.md":     "# A\n\n## Import layers\n\n| layer | packages |\n|---|---|\n| 7 | `e2e/...` | demos | any |\n| 6 | `internal/tm` | machinery | |\n| 1 | `internal/in` | x | |\n\n## Next\n\n| 6 | `not/this` | | |\n",
	"docs/not-go.md":      "text\n",
	"internal/in/in_x.go": "package in\n",
}

func TestMeasureFixture(t *testing.T) {
	root := t.TempDir()
	for name, src := range fixture {
		file := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fset := token.NewFileSet()
	pkgs, nested, err := walk(root, fset)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	byDir := map[string]*pkg{}
	for _, p := range pkgs {
		dirs = append(dirs, p.dir)
		byDir[p.dir] = p
	}
	if got, want := strings.Join(dirs, " "), ". cmd/tool e2e/suite internal/in internal/tm"; got != want || nested != 1 {
		t.Fatalf("packages %q, nested modules %d; want %q, 1", got, nested, want)
	}
	if got, want := byDir["."].lines, strings.Count(fixture["m.go"], "\n"); got != want {
		t.Errorf("root package lines %d, want %d (test files left out)", got, want)
	}

	if got := layerFolders(filepath.Join(root, "ARCHITECTURE.md"), "6", "7"); strings.Join(got, " ") != "e2e internal/tm" {
		t.Errorf("layer 6 and 7 folders %q, want [e2e internal/tm]", got)
	}
	if !under("internal/tm/sub", []string{"internal/tm"}) || under("internal/tmx", []string{"internal/tm"}) {
		t.Error("under must match a folder and its subfolders only")
	}

	// Exported: DefaultSize, Other, T, Embedded, Other2, T.Method, Decide; fields: Name, Kind,
	// Embedded, Other2.
	decls, fields, defaults := exported([]*pkg{byDir["."]})
	if decls != 7 || fields != 4 || defaults != 1 {
		t.Errorf("exported %d + %d fields, %d Default; want 7 + 4, 1", decls, fields, defaults)
	}

	fns := complexities(fset, []*pkg{byDir["."]})
	got := map[string]int{}
	for _, f := range fns {
		got[f.name] = f.complexity
	}
	if got["m.Decide"] != 10 || got["m.helper"] != 1 || got["m.(T).Method"] != 1 || len(fns) != 4 {
		t.Errorf("complexities %v; want m.Decide 10, the other three 1", got)
	}
	if s := cyclo(fns); s != "mean 3.25 over 4 functions; over 15: 0; over 25: 0" {
		t.Errorf("cyclo: %s", s)
	}

	if direct, total := requirements([]byte(fixture["go.mod"])); direct != 2 || total != 3 {
		t.Errorf("requirements %d / %d, want 2 / 3", direct, total)
	}

	// go doc of the one-function package: the package line, a blank, the FUNCTIONS heading and
	// its blank, the declaration and a trailing blank.
	n, err := goDocLines(root, []*pkg{byDir["internal/in"]})
	if err != nil || n != 6 {
		t.Errorf("go doc lines %d, %v; want 6", n, err)
	}
	if num(1234567) != "1,234,567" || num(999) != "999" {
		t.Errorf("num: %s %s", num(1234567), num(999))
	}
}
