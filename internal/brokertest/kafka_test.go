package brokertest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	t.Setenv(EnvKafkaEmbedded, "") // a real cluster here, also in .ci/run's kfake pass

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

// fatalTB records what Fatalf says and stops the call, as testing.T's Fatalf does.
type fatalTB struct {
	fakeTB
	fatal string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	panic(f)
}

// TestKafkaBrokersWithoutKafkaSaysWhatToStart: the library's tests do not start kfake (its go.mod
// does not require it), so with KAFKA_BROKERS unset and no StartEmbeddedKafka a Kafka test fails
// naming what to start, instead of skipping or dialling nothing.
func TestKafkaBrokersWithoutKafkaSaysWhatToStart(t *testing.T) {
	if testing.Short() {
		t.Skip("checks the failure of a test run without -short")
	}
	t.Setenv(broker.EnvKafkaBrokers, "")
	t.Setenv(EnvKafkaEmbedded, "")
	if StartEmbeddedKafka != nil {
		t.Fatal("the library's tests set no StartEmbeddedKafka")
	}
	f := &fatalTB{fakeTB: fakeTB{TB: t, name: "TestUser"}}
	func() {
		defer func() {
			if r := recover(); r != nil && r != any(f) {
				panic(r)
			}
		}()
		addrs := KafkaBrokers(f)
		t.Fatalf("KafkaBrokers returned %v with no Kafka", addrs)
	}()
	for _, want := range []string{"KAFKA_BROKERS is not set", "make services", "127.0.0.1:9092"} {
		if !strings.Contains(f.fatal, want) {
			t.Errorf("the failure %q does not say %q", f.fatal, want)
		}
	}
}
