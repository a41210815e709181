package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Helpers that format what the commands print.

// whenSet is when for a time that may be unset (nil).
func whenSet(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return when(*t)
}

// when formats a time with its age, e.g. "2026-03-01 10:00:00 UTC (3m12s ago)".
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	age := time.Since(t).Round(time.Second)
	s := t.Local().Format("2006-01-02 15:04:05 MST")
	if age >= 0 {
		return fmt.Sprintf("%s (%s ago)", s, age)
	}
	return s
}

func seconds(s float64) string {
	if s <= 0 {
		return "-"
	}
	d := time.Duration(s * float64(time.Second))
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func truncate(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// shellSafe are the characters a shell takes as they are in a word.
const shellSafe = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/"

// shellQuote quotes s for a command line an operator copies, when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, shellSafe) == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// joinInts writes ids and offsets for the terminal: "," where the list is to be pasted into
// -id, ", " where it is to be read.
func joinInts(vs []int64, sep string) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatInt(v, 10)
	}
	return strings.Join(parts, sep)
}
