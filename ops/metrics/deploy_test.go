package metrics

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The dashboard and the alert rules shipped in ops/deploy/ name only metrics this package exports,
// with only the labels those metrics have; the rules pass `promtool check rules` and their
// unit tests (`promtool test rules`), and every dashboard query parses as PromQL.
const (
	dashboardFile = "../deploy/grafana/watermill-once.json"
	rulesFile     = "../deploy/prometheus/watermill-once.rules.yml"
	rulesTestFile = "../deploy/prometheus/watermill-once.rules.test.yml"
)

var descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]+)".*variableLabels: \{([^}]*)\}\}$`)

// exported returns each exported metric's name with its label names.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, d := range allDescs {
		m := descPattern.FindStringSubmatch(d.String())
		require.NotNil(t, m, "cannot read %s", d)
		var labels []string
		if m[2] != "" {
			labels = strings.Split(m[2], ",")
		}
		out[m[1]] = labels
	}
	return out
}

// A metric name, optionally followed by a label selector; "wmonce_.*" in a regex matcher is
// not a name.
var (
	metricRef = regexp.MustCompile(`\b(wmonce_[a-z0-9_]*[a-z0-9])\b(\{[^}]*\})?`)
	matcher   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

// checkNames fails for each metric text names that is not exported, or selected by a label
// the metric does not have.
func checkNames(t *testing.T, file, text string, metrics map[string][]string) int {
	t.Helper()
	n := 0
	for _, m := range metricRef.FindAllStringSubmatch(text, -1) {
		n++
		labels, ok := metrics[m[1]]
		if !ok {
			t.Errorf("%s names %s, which ops/metrics does not export", file, m[1])
			continue
		}
		for _, l := range matcher.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(labels, l[1]) {
				t.Errorf("%s selects %s by label %q; its labels are %v", file, m[1], l[1], labels)
			}
		}
	}
	return n
}

// promtool returns the path of promtool, failing when there is none (skipped under -short).
func promtool(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs promtool: skipped under -short")
	}
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not on PATH: run `make services` (or `bash e2e/services up promtool`), or install Debian's prometheus package (`apt-get install -y --no-install-recommends prometheus`); it checks ops/deploy/prometheus")
	}
	return p
}

// The README's test command (make test, which runs make services) provides promtool, as it
// does Chromium: the services target asks for it, e2e/services installs it by default, and in
// the Docker mode the target says it is missing (issue 34, item 15).
func TestMakeServicesProvidesPromtool(t *testing.T) {
	t.Parallel()
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", path))
		require.NoError(t, err)
		return string(b)
	}
	makefile, script := read("Makefile"), read("e2e/services")
	services := regexp.MustCompile(`(?m)^services:\n(?:#.*\n)*\t.*WHAT="([^"]*)"`).FindStringSubmatch(makefile)
	require.NotNil(t, services, "Makefile: the services target")
	require.Contains(t, strings.Fields(services[1]), "promtool", "make services asks for promtool")
	require.Contains(t, makefile, `command -v promtool`, "the Docker mode says when promtool is missing")
	all := regexp.MustCompile(`what=\$\{\*:-([^}]*)\}`).FindStringSubmatch(script)
	require.NotNil(t, all, "e2e/services: the default list")
	require.Contains(t, strings.Fields(all[1]), "promtool", "e2e/services up installs promtool by default (.ci/run)")
	require.Regexp(t, `(?m)^\s+promtool\) promtool_up ;;$`, script)
	require.Regexp(t, `apt_install prometheus`, script)
}

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(promtool(t), args...).CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
}

func TestDeployFilesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	metrics := exported(t)
	rules, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	require.Greater(t, checkNames(t, rulesFile, string(rules), metrics), 10)

	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	var exprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	require.Greater(t, len(exprs), 20)
	require.Greater(t, checkNames(t, dashboardFile, string(raw), metrics), 20)

	// Every alert names a metric the dashboard charts too, so an alert can be looked at.
	for _, m := range metricRef.FindAllStringSubmatch(string(rules), -1) {
		if !strings.Contains(string(raw), m[1]) {
			t.Errorf("the dashboard charts no panel of %s, which an alert watches", m[1])
		}
	}

	// promtool: the rules, their unit tests, and the dashboard's queries (with Grafana's
	// variables filled in) as recording rules, which promtool parses.
	runPromtool(t, "check", "rules", rulesFile)
	runPromtool(t, "test", "rules", rulesTestFile)
	fill := strings.NewReplacer("$__rate_interval", "5m", "$consumer", ".*", "$relay", ".*")
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for _, e := range exprs {
		q, err := json.Marshal(fill.Replace(e)) // a JSON string is a YAML string
		require.NoError(t, err)
		b.WriteString("      - record: wmonce:dashboard:query\n        expr: " + string(q) + "\n")
	}
	queries := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	require.NoError(t, os.WriteFile(queries, []byte(b.String()), 0o644))
	runPromtool(t, "check", "rules", queries)
}
