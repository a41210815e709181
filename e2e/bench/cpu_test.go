package main

import (
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// backendCPU counts a backend present at the start from its reading then, keeps the last
// reading of one that is gone, and says unknown when a backend's /proc entry cannot be read.
func TestBackendCPUCountsFromTheStart(t *testing.T) {
	self := os.Getpid()
	c := newBackendCPU()
	c.observe([]int{self}, true)
	start, ok := procCPU(strconv.Itoa(self))
	require.True(t, ok)
	for until := start + 0.05; ; { // burn 50 ms of CPU
		if v, _ := procCPU("self"); v >= until {
			break
		}
	}
	c.observe([]int{self}, false)
	c.observe(nil, false) // gone: its last reading still counts
	sec, ok := c.seconds()
	require.True(t, ok)
	require.GreaterOrEqual(t, sec, 0.05)
	require.InDelta(t, c.last[self]-c.base[self], sec, 1e-9, "counted from the start, not from the process's birth")
	require.GreaterOrEqual(t, c.base[self], start-0.01)

	c.observe([]int{-1}, false) // not on this machine
	_, ok = c.seconds()
	require.False(t, ok)
}

func TestCPUPerMessage(t *testing.T) {
	res := Result{Messages: 2000}
	setCPUPerMessage(&res, 1.5, 0.5, true)
	require.InDelta(t, 750, *res.BenchCPUms1k, 1e-9)
	require.InDelta(t, 250, *res.PGCPUms1k, 1e-9)
	require.Equal(t, "750 / 250", res.cpuText())
	unknown := Result{Messages: 1000}
	setCPUPerMessage(&unknown, 1, 0, false)
	require.Equal(t, "1000 / -", unknown.cpuText())
}
