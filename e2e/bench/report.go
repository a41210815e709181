package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Report is everything one run measured; it is written as latest.json.
type Report struct {
	Machine Machine `json:"machine"`
	Config  Config  `json:"config"`
	// Results holds one object per variant and broker: its median round.
	Results []Result `json:"results"`
	Ratios  []Ratio  `json:"ratios"`
	// Rounds holds every round's result, in the order they ran.
	Rounds []Result `json:"rounds"`
}

// medians picks, for each variant and broker, the round with the median throughput (the
// lower middle one for an even count). A variant that failed in any round is reported as
// failed: a failure is never hidden behind the other rounds.
func medians(rounds []Result) []Result {
	type key struct{ variant, broker string }
	var order []key
	groups := map[key][]Result{}
	for _, r := range rounds {
		k := key{r.Variant, r.Broker}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []Result
	for _, k := range order {
		g := groups[k]
		if i := slices.IndexFunc(g, func(r Result) bool { return r.Error != "" }); i >= 0 {
			out = append(out, g[i])
			continue
		}
		// Idle variants measure queries per second instead of messages; the e2e variants run at
		// a fixed rate, so what varies, and picks their median round, is the p50 latency.
		value, unit, format := func(r Result) float64 { return r.MsgsPerSec }, "msgs/s", "%.0f"
		switch {
		case g[0].QueriesPerSec != nil:
			value, unit = func(r Result) float64 { return deref(r.QueriesPerSec) }, "queries/s"
		case slices.Contains(latencyVariants, k.variant):
			value, unit, format = func(r Result) float64 { return deref(r.P50ms) }, "p50 ms", "%.1f"
		}
		sorted := slices.Clone(g)
		slices.SortFunc(sorted, func(a, b Result) int { return cmp.Compare(value(a), value(b)) })
		m := sorted[(len(sorted)-1)/2]
		if len(g) > 1 {
			var all []string
			for _, r := range g {
				all = append(all, fmt.Sprintf(format, value(r)))
			}
			m.Notes += fmt.Sprintf("; median of %d rounds (%s by round: %s)", len(g), unit, strings.Join(all, ", "))
		}
		m.Round = 0
		out = append(out, m)
	}
	return out
}

// Config records the run's parameters.
type Config struct {
	Schema       string   `json:"schema"`
	Brokers      []string `json:"brokers"`
	Messages     int      `json:"messages"`
	ProcessRows  int      `json:"process_rows"`
	RelayRows    int      `json:"relay_rows"`
	InFlight     int      `json:"in_flight"`
	Preload      int      `json:"preload_rows"`
	PayloadBytes int      `json:"payload_bytes"`
	Duplicates   string   `json:"duplicates"`
	Rounds       int      `json:"rounds"`
	Latency      string   `json:"latency"`
	Command      string   `json:"command"`
	// Connections is how the pool was sized from the server's max_connections.
	Connections ConnBudget `json:"connections"`
}

func describeConfig(o options) Config {
	c := Config{
		Schema: o.schema, Messages: o.messages, ProcessRows: o.processRows, RelayRows: o.relayRows,
		InFlight: o.inFlight, Preload: o.preload, PayloadBytes: 256, Rounds: o.rounds,
		Duplicates: "none: every message has a fresh UUID (the dedupe check runs, against the pre-loaded table)",
		Latency: "consuming variants: time a message spends in the handler chain, from the router handing it over " +
			"until the chain returns after the commit (just before the ack), queueing for a group included; " +
			"C1: per statement. Not defined (null) for backlog drains: inbox processing, relay, forwarder.",
		Command: "go run ./e2e/bench " + strings.Join(os.Args[1:], " "),
	}
	for _, b := range o.brokers {
		c.Brokers = append(c.Brokers, string(b))
	}
	return c
}

func (r Result) line() string {
	if r.QueriesPerSec != nil {
		return fmt.Sprintf("%-8s %-16s %9.2f queries/s  %s", r.Broker, r.Variant, *r.QueriesPerSec, r.Notes)
	}
	lat := "      -         -"
	if r.P50ms != nil {
		lat = fmt.Sprintf("p50 %6.3fms p99 %6.3fms", *r.P50ms, *r.P99ms)
	}
	if r.Stages != nil {
		lat += " (" + r.Stages.String() + ")"
	}
	return fmt.Sprintf("%-8s %-16s %9.0f msgs/s  %s  busy %3.0f%% bench %3.0f%%  cpu ms/1k bench/pg %s  %s",
		r.Broker, r.Variant, r.MsgsPerSec, lat, r.MachineBusyPct, r.BenchCPUPct, r.cpuText(), r.Notes)
}

func (rep *Report) failed() bool {
	for _, r := range rep.Results {
		if r.Error != "" {
			return true
		}
	}
	return false
}

// Ratio is one figure compared with its target from the issue.
type Ratio struct {
	Name   string  `json:"name"`
	Broker string  `json:"broker"`
	Value  float64 `json:"value"`
	Target float64 `json:"target"`
	Unit   string  `json:"unit"` // "x" for ratios, "msgs/s" for throughputs (at least); "ms", "queries/s" (at most)
	Met    bool    `json:"met"`
}

// measured and target render the figure and its target in the ratio's unit.
func (r Ratio) measured() string {
	switch r.Unit {
	case "x":
		return fmt.Sprintf("%.2fx", r.Value)
	case "msgs/s":
		return fmt.Sprintf("%.0f/s", r.Value)
	}
	return fmt.Sprintf("%.1f %s", r.Value, r.Unit)
}

func (r Ratio) target() string {
	switch r.Unit {
	case "x":
		return fmt.Sprintf(">= %gx", r.Target)
	case "msgs/s":
		return fmt.Sprintf(">= %.0f/s", r.Target)
	}
	return fmt.Sprintf("<= %g %s", r.Target, r.Unit)
}

func find(results []Result, variant, broker string) (Result, bool) {
	for _, r := range results {
		if r.Variant == variant && r.Broker == broker && r.Error == "" && r.MsgsPerSec > 0 {
			return r, true
		}
	}
	return Result{}, false
}

func ratios(results []Result) []Ratio {
	var brokers []string
	for _, r := range results {
		if r.Broker != "postgres" && !slices.Contains(brokers, r.Broker) {
			brokers = append(brokers, r.Broker)
		}
	}
	var out []Ratio
	ratio := func(name, num, den, broker string, target float64) {
		a, ok1 := find(results, num, broker)
		b, ok2 := find(results, den, broker)
		if ok1 && ok2 {
			v := a.MsgsPerSec / b.MsgsPerSec
			out = append(out, Ratio{Name: name, Broker: broker, Value: v, Target: target, Unit: "x", Met: v >= target})
		}
	}
	absolute := func(name, variant, broker string, target float64) {
		if a, ok := find(results, variant, broker); ok {
			out = append(out, Ratio{Name: name, Broker: broker, Value: a.MsgsPerSec, Target: target, Unit: "msgs/s", Met: a.MsgsPerSec >= target})
		}
	}
	// Upper bounds from issue 14: end-to-end latency and the idle query rate.
	atMost := func(name, variant, broker, unit string, value func(Result) *float64, target float64) {
		for _, r := range results {
			if r.Variant == variant && r.Broker == broker && r.Error == "" && value(r) != nil {
				v := *value(r)
				out = append(out, Ratio{Name: name, Broker: broker, Value: v, Target: target, Unit: unit, Met: v <= target})
			}
		}
	}
	p50 := func(r Result) *float64 { return r.P50ms }
	p99 := func(r Result) *float64 { return r.P99ms }
	for _, b := range brokers {
		atMost("e2e-50 p50", E2E50, b, "ms", p50, 10)
		atMost("e2e-50 p99", E2E50, b, "ms", p99, 25)
		atMost("e2e-1000 p50", E2E1000, b, "ms", p50, 25) // issue 26, every broker
		atMost("e2e-1000 p99", E2E1000, b, "ms", p99, 100)
	}
	qps := func(r Result) *float64 { return r.QueriesPerSec }
	atMost("idle relay", IdleRelay, "postgres", "queries/s", qps, 2)
	atMost("idle SQL subscription", IdleSQLSub, "postgres", "queries/s", qps, 2)
	ratio("B3/B6", B3, B6, "sql", 0.45) // issue 26: the round-trip bound is 0.5
	for _, b := range brokers {
		ratio("B3/B1", B3, B1, b, 0.85)
		ratio("B4/B1", B4, B1, b, 1.4) // issue 26: group commit, the default, at 64 in flight
		ratio("relay/forwarder", Relay, Forwarder, b, 2)
		ratio("relay-lanes/forwarder", RelayLane, Forwarder, b, 2)
		absolute("B5 ingest", B5Ingest, b, 40000)
	}
	absolute("B5 ingest (burst, no broker)", B5Ingest, "postgres", 40000)
	ratio("B4/B6", B4, B6, "sql", 2)
	absolute("B5 processing", B5Process, "postgres", 30000)
	for _, b := range brokers { // issue 37: the batch handler
		if b == "amqp" {
			ratio("B7/B0", B7, B0, b, 0.75)
		} else {
			ratio("B7/B1", B7, B1, b, 4)
		}
	}
	absolute("B7 processing", B7Process, "postgres", 30000)
	return out
}

func (rep *Report) ratioText() string {
	var b strings.Builder
	b.WriteString("Targets (the first round's, issue 14's and issue 26's):\n")
	for _, r := range rep.Ratios {
		mark := "MISSED"
		if r.Met {
			mark = "met"
		}
		fmt.Fprintf(&b, "  %-28s %-8s %10s   target %-12s %s\n", r.Name, r.Broker, r.measured(), r.target(), mark)
	}
	return b.String()
}

// latencyMarkdown renders the end-to-end latency and idle query-rate tables (empty when the
// run had neither).
func (rep *Report) latencyMarkdown() string {
	var b strings.Builder
	var e2e, idle []Result
	for _, r := range rep.Results {
		switch {
		case slices.Contains(latencyVariants, r.Variant):
			e2e = append(e2e, r)
		case slices.Contains(idleVariants, r.Variant):
			idle = append(idle, r)
		}
	}
	if len(e2e) > 0 {
		b.WriteString("\n## End-to-end latency\n\nProducer COMMIT of an outbox row -> Relay -> broker -> effectively-once consumer's commit, every component with its default settings. Stages (p50 / p99 ms): commit -> the relay's Publish call (waking and reading), Publish -> the consumer's handler chain (the broker, and queueing at the consumer), handler chain -> the consumer's commit (the middleware's transaction).\n\n")
		b.WriteString("| broker | variant | events/s achieved | p50 ms | p99 ms | events | commit -> publish | publish -> handler | handler -> commit |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range e2e {
			if r.Error != "" {
				fmt.Fprintf(&b, "| %s | %s | ERROR: %s | | | | | | |\n", r.Broker, r.Variant, strings.ReplaceAll(r.Error, "|", "/"))
				continue
			}
			st := func(l StageLatency) string { return fmt.Sprintf("%.1f / %.1f", l.P50ms, l.P99ms) }
			a, d, c := "", "", ""
			if s := r.Stages; s != nil {
				a, d, c = st(s.ToPublish), st(s.ToDeliver), st(s.ToApply)
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.1f | %.1f | %d | %s | %s | %s |\n", r.Broker, r.Variant, r.MsgsPerSec, deref(r.P50ms), deref(r.P99ms), r.Messages, a, d, c)
		}
	}
	if len(idle) > 0 {
		b.WriteString("\n## Idle query rate\n\nQueries per second sent to PostgreSQL with no traffic at all, counted at the wire on a pool of the component's own.\n\n")
		b.WriteString("| component | queries/s | notes |\n|---|---:|---|\n")
		for _, r := range idle {
			if r.Error != "" {
				fmt.Fprintf(&b, "| %s | | ERROR: %s |\n", r.Variant, strings.ReplaceAll(r.Error, "|", "/"))
				continue
			}
			fmt.Fprintf(&b, "| %s | %.2f | %s |\n", r.Variant, deref(r.QueriesPerSec), strings.ReplaceAll(r.Notes, "|", "/"))
		}
	}
	return b.String()
}

func deref(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// markdown renders the results for latest.md and docs/performance.md.
func (rep *Report) markdown() string {
	var b strings.Builder
	m := rep.Machine
	fmt.Fprintf(&b, "# watermill-once benchmark\n\n")
	fmt.Fprintf(&b, "Measured %s on %d CPUs (%s), %.0f GiB RAM, %s; PostgreSQL %s; %s. Load average %s at start, %s at end (the machine is shared: compare ratios within this run, not absolute figures across runs).\n\n",
		m.Date, m.CPUs, m.Model, m.MemoryGiB, m.OS, m.PostgreSQL, m.GoVersion, m.LoadAvgStart, m.LoadAvgEnd)
	if m.Kafka != "" {
		fmt.Fprintf(&b, "Kafka: %s. ", m.Kafka)
	}
	if m.RabbitMQ != "" {
		fmt.Fprintf(&b, "RabbitMQ: %s. ", m.RabbitMQ)
	}
	c := rep.Config
	fmt.Fprintf(&b, "Payload %d bytes; %d messages per consuming variant, %d in flight; processed_messages pre-loaded with %d rows. Duplicates: %s. Each figure is the median of %d rounds run one after the other (every round is in latest.json).\n\n",
		c.PayloadBytes, c.Messages, c.InFlight, c.Preload, c.Duplicates, c.Rounds)
	if cb := c.Connections; cb.Max > 0 {
		fmt.Fprintf(&b, "PostgreSQL connections: pool of %d, sized from max_connections %d (%d reserved, %d in use by all clients at the start).\n\n", cb.Pool, cb.Max, cb.Reserved, cb.InUse)
	}
	fmt.Fprintf(&b, "Latency: %s\n\nCommand: `%s`\n\n", c.Latency, c.Command)

	// Pivot: msgs/s per variant and broker.
	var brokers []string
	for _, r := range rep.Results {
		if !slices.Contains(brokers, r.Broker) {
			brokers = append(brokers, r.Broker)
		}
	}
	b.WriteString("## Throughput (msgs/s)\n\n| variant | what it runs |")
	for _, br := range brokers {
		fmt.Fprintf(&b, " %s |", br)
	}
	b.WriteString("\n|---|---|")
	for range brokers {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, v := range allVariants {
		if slices.Contains(latencyVariants, v) || slices.Contains(idleVariants, v) {
			continue // their own tables below
		}
		row := fmt.Sprintf("| %s | %s |", v, variantTitles[v])
		any := false
		for _, br := range brokers {
			if r, ok := find(rep.Results, v, br); ok {
				row += fmt.Sprintf(" %.0f |", r.MsgsPerSec)
				any = true
			} else {
				row += " |"
			}
		}
		if any {
			b.WriteString(row + "\n")
		}
	}
	b.WriteString(rep.latencyMarkdown())
	b.WriteString("\n## Targets\n\n| figure | broker | measured | target | |\n|---|---|---:|---:|---|\n")
	for _, r := range rep.Ratios {
		mark := "**missed**"
		if r.Met {
			mark = "met"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.Name, r.Broker, r.measured(), r.target(), mark)
	}
	b.WriteString("\n## All results\n\n| broker | variant | msgs/s | p50 ms | p99 ms | messages | in flight | CPU busy (all / bench) | CPU ms per 1k msgs (bench / PostgreSQL) | PostgreSQL sessions | notes |\n|---|---|---:|---:|---:|---:|---:|---|---:|---|---|\n")
	for _, r := range rep.Results {
		p50, p99 := "-", "-"
		if r.P50ms != nil {
			p50, p99 = fmt.Sprintf("%.3f", *r.P50ms), fmt.Sprintf("%.3f", *r.P99ms)
		}
		notes := r.Notes
		if r.Error != "" {
			notes = "ERROR: " + r.Error
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s | %d | %d | %.0f%% / %.0f%% | %s | %s | %s |\n",
			r.Broker, r.Variant, r.MsgsPerSec, p50, p99, r.Messages, r.InFlight, r.MachineBusyPct, r.BenchCPUPct, r.cpuText(), r.PGSessions, strings.ReplaceAll(notes, "|", "/"))
	}
	b.WriteString("\n![throughput chart](latest.png)\n")
	return b.String()
}

func writeResults(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.md"), []byte(rep.markdown()), 0o644); err != nil {
		return err
	}
	png, err := chart(rep)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.png"), png, 0o644); err != nil {
		return err
	}
	lat, err := latencyChart(rep)
	if err != nil || lat == nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "latency.png"), lat, 0o644)
}

// render writes the markdown and the chart of a saved report again.
func render(jsonPath, dir string) error {
	js, err := os.ReadFile(jsonPath)
	if err != nil {
		return err
	}
	var rep Report
	if err := json.Unmarshal(js, &rep); err != nil {
		return fmt.Errorf("%s: %w", jsonPath, err)
	}
	if dir == "" {
		return errors.New("-render needs -out")
	}
	if len(rep.Rounds) > 0 { // the medians by this version's rules
		rep.Results = medians(rep.Rounds)
		rep.Ratios = ratios(rep.Results)
	}
	return writeResults(dir, &rep)
}
