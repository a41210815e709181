package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// CPU per message: the CPU time of this process and of the benchmark's PostgreSQL backends while
// a variant runs, per 1,000 messages. On a shared machine throughput moves with everyone's load;
// the CPU a message costs moves much less, so a gain shows as less work, not only as more msgs/s.
//
// PostgreSQL's share is read from /proc/<pid>/stat of the backends that pg_stat_activity lists
// under the benchmark's application_name (PostgreSQL must run on this machine, in the same PID
// namespace; else it reads as unknown). pg_stat_statements is not needed, and would miss what a
// backend spends outside statements (parsing, COMMIT's WAL flush). The broker's own processes
// (Kafka, RabbitMQ) are not counted.

// procCPU returns the user+system CPU seconds of process pid ("self" for this one).
func procCPU(pid string) (float64, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the command name, which is in parentheses and may contain spaces.
	str := string(b)
	i := strings.LastIndexByte(str, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(str[i+1:])
	if len(f) <= 13 {
		return 0, false
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	s, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (u + s) / clockTicks, true
}

// backendCPU follows the CPU time of the benchmark's backends across a variant. A backend there
// at the start counts from its reading then; one that connects later counts from zero; one that
// disconnects counts up to its last reading (taken at every wait sample, 50 ms apart).
type backendCPU struct {
	base, last map[int]float64
	unreadable bool // a backend's /proc entry could not be read: PostgreSQL is elsewhere
}

func newBackendCPU() *backendCPU {
	return &backendCPU{base: map[int]float64{}, last: map[int]float64{}}
}

// observe reads the CPU time of pids; start marks the readings taken before the variant began.
func (c *backendCPU) observe(pids []int, start bool) {
	for _, pid := range pids {
		v, ok := procCPU(strconv.Itoa(pid))
		if !ok {
			if _, seen := c.last[pid]; !seen {
				c.unreadable = true
			}
			continue
		}
		if start {
			c.base[pid] = v
		}
		c.last[pid] = v
	}
}

// seconds is the CPU time the backends spent since the start; ok=false when it is unknown.
func (c *backendCPU) seconds() (float64, bool) {
	if c.unreadable || len(c.last) == 0 {
		return 0, false
	}
	total := 0.0
	for pid, v := range c.last {
		total += v - c.base[pid]
	}
	return total, true
}

// backendPIDs lists the backends of application app, except the caller's own.
func backendPIDs(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, app string) ([]int, error) {
	rows, err := q.QueryContext(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, rows.Err()
}

// setCPUPerMessage fills res's CPU per 1,000 messages from the CPU seconds a variant used.
func setCPUPerMessage(res *Result, benchSec float64, pgSec float64, pgKnown bool) {
	if res.Messages <= 0 {
		return
	}
	per1k := func(sec float64) *float64 { return ms(1000 * sec * 1000 / float64(res.Messages)) }
	res.BenchCPUms1k = per1k(benchSec)
	if pgKnown {
		res.PGCPUms1k = per1k(pgSec)
	}
}

// cpuText renders the CPU per 1,000 messages, "-" where unknown.
func (r Result) cpuText() string {
	f := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f", *v)
	}
	return f(r.BenchCPUms1k) + " / " + f(r.PGCPUms1k)
}
