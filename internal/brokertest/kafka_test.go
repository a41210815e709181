package brokertest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/wmonce/watermill-once/broker"
)

// fakeTB collects cleanups so a test can end a "test" holding a lock when it chooses.
type fakeTB struct {
	testing.TB
	name     string
	cleanups []func()
}

func (f *fakeTB) Name() string        { return f.name }
func (f *fakeTB) Cleanup(fn func())   { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) Logf(string, ...any) {}
func (f *fakeTB) end() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

// tryExclusive reports whether an exclusive lock on the cluster's lock file is free now, as
// another test binary would see it.
func tryExclusive(t *testing.T, addr string) bool {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "wmonce-kafka-"+lockName.ReplaceAllString(addr, "_")+".lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// TestKafkaLock: a test using KAFKA_BROKERS holds a shared lock that keeps an exclusive one
// (a broker kill) out until it ends; the exclusive holder's own subtests take no shared lock
// (they would wait for their parent forever).
func TestKafkaLock(t *testing.T) {
	addr := "127.0.0.1:1" // never dialled: the lock is named after the address
	t.Setenv(broker.EnvKafkaBrokers, addr)

	user := &fakeTB{TB: t, name: "TestUser"}
	if got := KafkaBrokers(user); len(got) != 1 || got[0] != addr {
		t.Fatalf("KafkaBrokers = %v", got)
	}
	if tryExclusive(t, addr) {
		t.Fatal("an exclusive lock was granted while a test held the cluster")
	}
	user.end()
	if !tryExclusive(t, addr) {
		t.Fatal("the shared lock outlived its test")
	}

	killer := &fakeTB{TB: t, name: "TestKiller"}
	LockKafkaExclusive(killer)
	sub := &fakeTB{TB: t, name: "TestKiller/step"}
	KafkaBrokers(sub) // returns at once: no shared lock for the holder's subtests
	if len(sub.cleanups) != 0 {
		t.Fatal("a subtest of the exclusive holder took a shared lock")
	}
	if tryExclusive(t, addr) {
		t.Fatal("the exclusive lock is not held")
	}
	killer.end()
	if !tryExclusive(t, addr) {
		t.Fatal("the exclusive lock outlived its test")
	}
}

// TestKafkaHelpersSkipUnderShort: under -short every helper that needs the real Kafka broker
// skips the test, whatever the environment names: `make test-short` points KAFKA_BROKERS at a
// closed port, and the broker-kill tests used to fail there for the missing KAFKA_SERVICE
// instead of skipping.
func TestKafkaHelpersSkipUnderShort(t *testing.T) {
	if !testing.Short() {
		t.Skip("checks what -short does: run with -short")
	}
	t.Setenv(broker.EnvKafkaBrokers, "127.0.0.1:1")
	t.Setenv(EnvKafkaService, "")
	for name, helper := range map[string]func(testing.TB){
		"KafkaBrokers":       func(t testing.TB) { KafkaBrokers(t) },
		"KafkaService":       func(t testing.TB) { KafkaService(t) },
		"LockKafkaExclusive": LockKafkaExclusive,
	} {
		t.Run(name, func(t *testing.T) {
			helper(t)
			t.Fatalf("%s returned under -short instead of skipping", name)
		})
	}
}
