// Command measure prints the indicators issue 36 compares Go codebases by (lines, go doc lines,
// exported names, Default constants, go.mod requirements, cyclomatic complexity), counted the same
// way for any checkout, so this repository's figures can be set beside another's:
//
//	go run ./.ci/measure [-top N] [-exclude dir,dir] [checkout]
//
// It reads the files with go/ast and runs `go doc` in GOPATH mode, so it needs no network and
// none of the checkout's dependencies. Its folder starts with a dot: `go build ./...` and
// `go vet ./...` skip it, and the library never imports it.
package main

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// pkg is one folder of Go files of the checkout's root module.
type pkg struct {
	dir, name string // dir: slash-separated, relative to the checkout, "." for the root
	lines     int    // of the non-test files
	files     []*ast.File
}

// fn is one function or method declaration and its McCabe complexity.
type fn struct {
	name, pos  string
	complexity int
}

func main() {
	top := flag.Int("top", 10, "how many of the most complex functions to list")
	exclude := flag.String("exclude", "", "comma-separated folders (relative to the checkout) to leave out of the library besides e2e and examples (Watermill: dev)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: go run ./.ci/measure [flags] [checkout (default .)]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 1 {
		flag.Usage()
		os.Exit(2)
	}
	root := "."
	if flag.NArg() == 1 {
		root = flag.Arg(0)
	}
	if err := run(root, *top, *exclude); err != nil {
		fmt.Fprintln(os.Stderr, "measure:", err)
		os.Exit(1)
	}
}

func run(root string, top int, exclude string) error {
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return fmt.Errorf("%s is not a Go module's root: %w", root, err)
	}
	fset := token.NewFileSet()
	pkgs, nested, err := walk(root, fset)
	if err != nil {
		return err
	}

	// The library: the root module without its demos and end-to-end suites (and -exclude); its
	// core: without, too, the test machinery of layers 6 and 7 where the checkout's ARCHITECTURE.md
	// has this repository's import layers.
	outside := []string{"e2e", "examples"}
	if exclude != "" {
		outside = append(outside, strings.Split(exclude, ",")...)
	}
	var machinery []string
	for _, m := range layerFolders(filepath.Join(root, "ARCHITECTURE.md"), "6", "7") {
		if !under(m, outside) {
			machinery = append(machinery, m)
		}
	}
	var all, lib, core int
	var libPkgs, corePkgs, public []*pkg
	var publicDirs []string
	for _, p := range pkgs {
		all += p.lines
		if under(p.dir, outside) {
			continue
		}
		lib += p.lines
		libPkgs = append(libPkgs, p)
		if p.name != "main" && !under(p.dir, []string{"cmd"}) && !slices.Contains(strings.Split(p.dir, "/"), "internal") {
			public = append(public, p)
			publicDirs = append(publicDirs, p.dir)
		}
		if !under(p.dir, machinery) {
			core += p.lines
			corePkgs = append(corePkgs, p)
		}
	}
	row := func(label, value, how string) { fmt.Printf("  %-40s %10s  %s\n", label, value, how) }

	abs, _ := filepath.Abs(root)
	fmt.Printf("measure %s (module %s)\n\n", abs, modulePath(gomod))
	fmt.Printf("non-test Go lines (wc -l of every .go file but *_test.go; testdata, vendor, _ and . folders and %d nested modules left out)\n", nested)
	row("root module", num(all), "every package of the go.mod at the root")
	row("library", num(lib), "without "+strings.Join(outside, " "))
	row("library without test machinery", num(core), "also without ARCHITECTURE.md's layers 6 and 7: "+cmp.Or(strings.Join(machinery, " "), "(none)"))

	docLines, err := goDocLines(root, public)
	if err != nil {
		return err
	}
	fmt.Printf("\npublic packages (%d): the library's packages but internal/, cmd/ and main: %s\n", len(public), strings.Join(publicDirs, " "))
	row("go doc -all lines", num(docLines), "GO111MODULE=off go doc -all DIR | wc -l, summed")
	decls, fields, defaults := exported(public)
	row("exported declarations + exported fields", fmt.Sprintf("%d + %d", decls, fields),
		"go/ast: exported types, funcs, methods of exported types, const and var names")
	row("", "", "+ exported fields (named, or embedded of an exported type) of exported struct types")
	row("exported Default… constants", num(defaults), "exported const names beginning with Default")
	direct, total := requirements(gomod)
	row("go.mod requirements direct / total", fmt.Sprintf("%d / %d", direct, total), "require lines of go.mod; indirect: marked // indirect")

	fmt.Println("\ncyclomatic complexity of the func declarations (gocyclo's rule: 1 + each if, for, range,")
	fmt.Println("non-default case and select case, &&, ||; a func literal counts in its enclosing function)")
	fns := complexities(fset, libPkgs)
	row("library", "", cyclo(fns))
	row("library without test machinery", "", cyclo(complexities(fset, corePkgs)))
	sort.SliceStable(fns, func(i, j int) bool { return fns[i].complexity > fns[j].complexity })
	top = min(top, len(fns))
	fmt.Printf("  the library's %d most complex:\n", top)
	for _, f := range fns[:top] {
		fmt.Printf("    %4d  %-44s %s\n", f.complexity, f.name, f.pos)
	}
	fmt.Println("\nfiles one delivery passes through: not measured here (it needs a traced run of a delivery)")
	return nil
}

// walk parses the non-test Go files of the root module, folder by folder, and counts the modules
// nested below it, which it leaves out as `go list ./...` does.
func walk(root string, fset *token.FileSet) (pkgs []*pkg, nested int, err error) {
	byDir := map[string]*pkg{}
	err = filepath.WalkDir(root, func(file string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, file)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			if base := d.Name(); strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata" || base == "vendor" {
				return filepath.SkipDir // as the go command does
			}
			if _, err := os.Stat(filepath.Join(file, "go.mod")); err == nil {
				nested++
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, rel, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parse: %w", err)
		}
		p := byDir[path.Dir(rel)]
		if p == nil {
			p = &pkg{dir: path.Dir(rel), name: f.Name.Name}
			byDir[p.dir] = p
			pkgs = append(pkgs, p)
		}
		p.lines += bytes.Count(src, []byte("\n"))
		p.files = append(p.files, f)
		return nil
	})
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].dir < pkgs[j].dir })
	return pkgs, nested, err
}

// goDocLines sums the lines `go doc -all` prints for each package. GOPATH mode reads the folder
// alone, so a checkout whose dependencies are not in the module cache is measured offline too.
func goDocLines(root string, pkgs []*pkg) (int, error) {
	total := 0
	for _, p := range pkgs {
		cmd := exec.Command("go", "doc", "-all", "./"+p.dir)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GO111MODULE=off", "GOFLAGS=")
		out, err := cmd.Output()
		if err != nil {
			return 0, fmt.Errorf("go doc -all ./%s: %w", p.dir, err)
		}
		total += bytes.Count(out, []byte("\n"))
	}
	return total, nil
}

// exported counts the exported top-level names of the packages (types; functions; methods whose
// receiver type is exported; each const and var name), the exported fields of their exported
// struct types (an embedded field is named by its type), and the exported constants Default….
func exported(pkgs []*pkg) (decls, fields, defaults int) {
	for _, p := range pkgs {
		for _, f := range p.files {
			for _, d := range f.Decls {
				if d, ok := d.(*ast.FuncDecl); ok {
					if d.Name.IsExported() && (d.Recv == nil || ast.IsExported(typeName(d.Recv.List[0].Type))) {
						decls++
					}
					continue
				}
				d := d.(*ast.GenDecl)
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						decls++
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, fl := range st.Fields.List {
								if len(fl.Names) == 0 && ast.IsExported(typeName(fl.Type)) {
									fields++
								}
								for _, n := range fl.Names {
									if n.IsExported() {
										fields++
									}
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								decls++
								if d.Tok == token.CONST && strings.HasPrefix(n.Name, "Default") {
									defaults++
								}
							}
						}
					}
				}
			}
		}
	}
	return decls, fields, defaults
}

// complexities gives each function and method declaration its McCabe complexity, as gocyclo
// counts it.
func complexities(fset *token.FileSet, pkgs []*pkg) []fn {
	var fns []fn
	for _, p := range pkgs {
		for _, f := range p.files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok {
					continue
				}
				c := 1
				ast.Inspect(fd, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
						c++
					case *ast.CaseClause:
						if n.List != nil { // not default
							c++
						}
					case *ast.CommClause:
						if n.Comm != nil {
							c++
						}
					case *ast.BinaryExpr:
						if n.Op == token.LAND || n.Op == token.LOR {
							c++
						}
					}
					return true
				})
				name := p.name + "." + fd.Name.Name
				if fd.Recv != nil {
					name = p.name + ".(" + typeName(fd.Recv.List[0].Type) + ")." + fd.Name.Name
				}
				pos := fset.Position(fd.Pos())
				fns = append(fns, fn{name: name, pos: fmt.Sprintf("%s:%d", pos.Filename, pos.Line), complexity: c})
			}
		}
	}
	return fns
}

// cyclo sums the complexities up: their mean and how many are above 15 and above 25.
func cyclo(fns []fn) string {
	sum, over15, over25 := 0, 0, 0
	for _, f := range fns {
		sum += f.complexity
		if f.complexity > 15 {
			over15++
		}
		if f.complexity > 25 {
			over25++
		}
	}
	return fmt.Sprintf("mean %.2f over %d functions; over 15: %d; over 25: %d",
		float64(sum)/float64(max(len(fns), 1)), len(fns), over15, over25)
}

// typeName is the name of a named type, without pointer, package or type parameters.
func typeName(t ast.Expr) string {
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.SelectorExpr:
			t = x.Sel
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.ParenExpr:
			t = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// requirements counts go.mod's required modules, in require blocks and single require lines.
func requirements(gomod []byte) (direct, total int) {
	inBlock := false
	for _, line := range strings.Split(string(gomod), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case inBlock && line == ")":
			inBlock = false
			continue
		case strings.HasPrefix(line, "require ("):
			inBlock = true
			continue
		case !inBlock && !strings.HasPrefix(line, "require "), line == "", strings.HasPrefix(line, "//"):
			continue
		}
		total++
		if !strings.Contains(line, "// indirect") {
			direct++
		}
	}
	return direct, total
}

// layerFolders reads the folders of the given layers in the "Import layers" table of an
// ARCHITECTURE.md like this repository's (`internal/pgtest`, `e2e/...`); none without one.
func layerFolders(file string, layers ...string) []string {
	src, _ := os.ReadFile(file)
	var out []string
	on := false
	code := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(line, "## ") {
			on = strings.HasPrefix(line, "## Import layers")
		}
		cells := strings.Split(line, "|")
		if on && len(cells) > 3 && slices.Contains(layers, strings.TrimSpace(cells[1])) {
			for _, m := range code.FindAllStringSubmatch(cells[2], -1) {
				out = append(out, strings.TrimSuffix(m[1], "/..."))
			}
		}
	}
	return out
}

// under tells whether dir is one of the folders or below one.
func under(dir string, folders []string) bool {
	for _, f := range folders {
		if f = strings.Trim(filepath.ToSlash(f), "/"); f != "" && (dir == f || strings.HasPrefix(dir, f+"/")) {
			return true
		}
	}
	return false
}

func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return "?"
}

// num writes n with thousands separators, as the table does.
func num(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
