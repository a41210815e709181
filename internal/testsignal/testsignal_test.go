package testsignal

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSignal(t *testing.T) {
	t.Parallel()
	var inert Signal[int]
	for range bufferSize + 1 {
		inert.Signal(1) // the zero value never blocks nor panics
	}
	var s Signal[int]
	s.Init()
	for i := range 3 {
		s.Signal(i)
	}
	require.Equal(t, 0, s.WaitOrTimeout())
	require.Equal(t, 2, s.WaitFor(func(v int) bool { return v == 2 }))
	require.Panics(t, func() { var u Signal[int]; u.WaitOrTimeout() })
}
