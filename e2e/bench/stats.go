package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// meter counts messages that a handler chain finished successfully and records how long each
// one spent in the chain: from the router handing it over until the chain returned (for the
// database variants: after the commit, just before the ack). It is the outermost middleware.
//
// A message counts once: a redelivery (a rebalance, a requeue) that the chain finishes again
// is counted in redelivered, not in count. Counting it would let the wait end while another
// message's effect has not committed yet, and the variant's check would then fail for a reason
// that has nothing to do with what it measures.
type meter struct {
	want        int
	count       atomic.Int64
	errs        atomic.Int64
	redelivered atomic.Int64
	seen        sync.Map     // message UUID -> struct{}
	first       atomic.Int64 // unix nanos of the first message entering the chain
	last        atomic.Int64 // unix nanos of the want-th success
	lat         []time.Duration
	done        chan struct{}
	once        sync.Once
}

func newMeter(want int) *meter {
	return &meter{want: want, lat: make([]time.Duration, want), done: make(chan struct{})}
}

func (m *meter) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		start := time.Now()
		m.first.CompareAndSwap(0, start.UnixNano())
		out, err := h(msg)
		if err != nil {
			m.errs.Add(1)
			return out, err
		}
		m.observe(msg.UUID, start)
		return out, nil
	}
}

// observe records one success of message uuid that started at start.
func (m *meter) observe(uuid string, start time.Time) {
	now := time.Now()
	if _, again := m.seen.LoadOrStore(uuid, struct{}{}); again {
		m.redelivered.Add(1)
		return
	}
	i := m.count.Add(1)
	if i <= int64(m.want) {
		m.lat[i-1] = now.Sub(start)
	}
	if i == int64(m.want) {
		m.last.Store(now.UnixNano())
		m.once.Do(func() { close(m.done) })
	}
}

// wait blocks until want successes or ctx ends.
func (m *meter) wait(ctx context.Context) error {
	select {
	case <-m.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("only %d of %d messages processed (%d handler errors): %w", m.count.Load(), m.want, m.errs.Load(), ctx.Err())
	}
}

func (m *meter) elapsed() time.Duration {
	return time.Duration(m.last.Load() - m.first.Load())
}

// percentiles returns p50 and p99 of the recorded latencies, in milliseconds.
func percentiles(lat []time.Duration) (p50, p99 float64) {
	if len(lat) == 0 {
		return 0, 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s))+0.5) - 1
		i = min(max(i, 0), len(s)-1)
		return float64(s[i].Microseconds()) / 1000
	}
	return at(0.50), at(0.99)
}

// cpuSample is a reading of the machine's and this process's CPU time.
type cpuSample struct {
	at          time.Time
	machineBusy float64 // seconds, all CPUs
	machineAll  float64
	self        float64 // seconds of this process (user + system)
}

const clockTicks = 100 // USER_HZ on Linux

func readCPU() cpuSample {
	s := cpuSample{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:] {
			n, _ := strconv.ParseFloat(v, 64)
			s.machineAll += n / clockTicks
			if i != 3 && i != 4 { // idle, iowait
				s.machineBusy += n / clockTicks
			}
		}
	}
	s.self, _ = procCPU("self")
	return s
}

// cpuUse describes the CPU use between two samples: the machine's busy share of all CPUs,
// and this process's share of all CPUs.
func cpuUse(a, b cpuSample) (machineBusyPct, selfPct float64) {
	all := b.machineAll - a.machineAll
	if all <= 0 {
		return 0, 0
	}
	wall := b.at.Sub(a.at).Seconds()
	cpus := all / wall
	return 100 * (b.machineBusy - a.machineBusy) / all, 100 * (b.self - a.self) / (wall * cpus)
}

// waitSampler samples, every interval, what the benchmark's own PostgreSQL sessions are doing
// (pg_stat_activity of sessions with our application_name): running on CPU, waiting on a lock
// or on WAL, or idle in a transaction (waiting for the client).
type waitSampler struct {
	mu      sync.Mutex
	counts  map[string]int
	samples int
	// backends follows the sessions' CPU time (cpu.go); read it after finish.
	backends *backendCPU
	stop     context.CancelFunc
	done     chan struct{}
}

func startWaitSampler(db *sql.DB, app string, every time.Duration) *waitSampler {
	ctx, cancel := context.WithCancel(context.Background())
	w := &waitSampler{counts: map[string]int{}, stop: cancel, done: make(chan struct{}), backends: newBackendCPU()}
	// The backends there before the variant starts count from their CPU time now.
	if pids, err := backendPIDs(ctx, db, app); err == nil {
		w.backends.observe(pids, true)
	} else {
		w.backends.unreadable = true
	}
	go func() {
		defer close(w.done)
		conn, err := db.Conn(ctx)
		if err != nil {
			return
		}
		defer conn.Close()
		t := time.NewTicker(every)
		defer t.Stop()
		sample := func(ctx context.Context) {
			states, pids, err := sessionStates(ctx, conn, app)
			if err != nil {
				return
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			w.backends.observe(pids, false)
			w.samples++
			for _, s := range states {
				if s != "Idle" {
					w.counts[s]++
				}
			}
		}
		for {
			select {
			case <-ctx.Done():
				sample(context.Background()) // the backends' CPU time at the end
				return
			case <-t.C:
			}
			sample(ctx)
		}
	}()
	return w
}

// sessionStates returns what each session of application app is doing (a wait event, CPU,
// IdleInTx or Idle) and its backend's pid.
func sessionStates(ctx context.Context, conn *sql.Conn, app string) ([]string, []int, error) {
	rows, err := conn.QueryContext(ctx, `SELECT CASE
    WHEN state = 'active' THEN coalesce(wait_event_type || ':' || wait_event, 'CPU')
    WHEN state = 'idle in transaction' THEN 'IdleInTx'
    ELSE 'Idle' END, pid
FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var states []string
	var pids []int
	for rows.Next() {
		var s string
		var pid int
		if err := rows.Scan(&s, &pid); err != nil {
			return nil, nil, err
		}
		states = append(states, s)
		pids = append(pids, pid)
	}
	return states, pids, rows.Err()
}

// finish stops sampling and returns the top states as "state share%" items, shares of all
// non-idle session samples.
func (w *waitSampler) finish(top int) string {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	total := 0
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range w.counts {
		total += v
		all = append(all, kv{k, v})
	}
	if total == 0 {
		return ""
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	var parts []string
	for i, e := range all {
		if i == top {
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.0f%%", e.k, 100*float64(e.v)/float64(total)))
	}
	avg := float64(total) / float64(max(w.samples, 1))
	return fmt.Sprintf("%s (avg %.1f busy sessions)", strings.Join(parts, ", "), avg)
}
