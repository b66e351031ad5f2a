package client_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeExampleIsExampleTest holds README.md's examples to example_test.go and
// example_gateway_test.go, which go test compiles and runs as ExampleTransport and
// ExampleGatewayTransport, in that order.
func TestReadmeExampleIsExampleTest(t *testing.T) {
	readme := readFile(t, "README.md")
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(readme, -1) {
		if strings.HasPrefix(m[1], "package ") {
			blocks = append(blocks, m[1])
		}
	}
	files := []struct{ file, example string }{
		{"example_test.go", "ExampleTransport"},
		{"example_gateway_test.go", "ExampleGatewayTransport"},
	}
	if len(blocks) != len(files) {
		t.Fatalf("README.md has %d go blocks starting with a package clause, want %d: the examples", len(blocks), len(files))
	}
	for i, f := range files {
		example := readFile(t, f.file)
		if blocks[i] != example {
			t.Errorf("README.md's example %d differs from %s; copy the file into it.\nREADME.md:\n%s", i+1, f.file, blocks[i])
		}
		if !strings.Contains(example, "func "+f.example+"()") || !strings.Contains(example, "\t// Output:\n") {
			t.Errorf("%s: want %s with an // Output: comment, so that go test runs it", f.file, f.example)
		}
	}
}

// TestReadmeTablesNameEveryField checks that the README's table of each configuration
// and statistics type has a row for every exported field of the type, and none other.
func TestReadmeTablesNameEveryField(t *testing.T) {
	readme := readFile(t, "README.md")
	fields := exportedFields(t)
	for _, typ := range []string{"Config", "TransportConfig", "Spread", "Query", "Stats", "GatewayConfig", "GatewayOptions", "GatewayError"} {
		want := fields[typ]
		if len(want) == 0 {
			t.Fatalf("type %s: no exported fields found in the package's sources", typ)
		}
		_, section, ok := strings.Cut(readme, "\n## "+typ+"\n")
		if !ok {
			if _, section, ok = strings.Cut(readme, "\n### "+typ+"\n"); !ok {
				t.Fatalf("README.md has no section ## %s", typ)
			}
		}
		if i := strings.Index(section, "\n#"); i >= 0 {
			section = section[:i]
		}
		var rows []string
		for _, m := range regexp.MustCompile("(?m)^\\| `(\\w+)` \\|").FindAllStringSubmatch(section, -1) {
			rows = append(rows, m[1])
		}
		slices.Sort(want)
		slices.Sort(rows)
		if !slices.Equal(rows, want) {
			t.Errorf("README.md's %s table names %v, the type's exported fields are %v", typ, rows, want)
		}
	}
}

// exportedFields are the exported field names of the package's struct types, by type.
func exportedFields(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			if st, ok := ts.Type.(*ast.StructType); ok {
				for _, fld := range st.Fields.List {
					for _, id := range fld.Names {
						if id.IsExported() {
							out[ts.Name.Name] = append(out[ts.Name.Name], id.Name)
						}
					}
				}
			}
			return false
		})
	}
	return out
}

// TestVersionIsTheProjects: client.Version is the project's VERSION, whose tag
// v<VERSION> the README's go get names.
func TestVersionIsTheProjects(t *testing.T) {
	want := strings.TrimSpace(readFile(t, filepath.Join("..", "..", "VERSION")))
	if client.Version != want {
		t.Errorf("client.Version = %q, VERSION holds %q", client.Version, want)
	}
	if readme := readFile(t, "README.md"); !strings.Contains(readme, "/pkg/client@v"+want+"\n") {
		t.Errorf("README.md's go get does not name the tag v%s", want)
	}
}
