package brokertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/wmonce/watermill-once/broker"
)

// EnvKafkaService names the line of the broker on KAFKA_BROKERS as e2e/services knows it
// ("3.9" or "4"), for tests that kill that broker with SIGKILL and start it again
// (e2e/services kafka-kill / kafka-start). It must name the broker KAFKA_BROKERS points at:
// 3.9 serves 127.0.0.1:9092, 4 serves 127.0.0.1:9094.
const EnvKafkaService = "KAFKA_SERVICE"

// EnvKafkaEmbedded, set to 1, says that KAFKA_BROKERS points at a kfake broker served by
// another process (`go run ./cmd/kfake` in internal/embeddedkafka's module): the tests use it
// as they use the embedded broker (no cluster lock, no topic cleanup, kfake's own behaviour
// expected). It is how the library's Kafka tests run on kfake without the library's go.mod
// requiring kfake (.ci/run's kfake pass).
const EnvKafkaEmbedded = "KAFKA_EMBEDDED"

// RealKafka returns the addresses of KAFKA_BROKERS, or nil when the tests use a kfake broker
// (KAFKA_BROKERS unset, or KAFKA_EMBEDDED=1).
func RealKafka() []string {
	if os.Getenv(EnvKafkaEmbedded) == "1" {
		return nil
	}
	return kafkaBrokersEnv()
}

// kafkaBrokersEnv returns the addresses of KAFKA_BROKERS, nil when it is unset.
func kafkaBrokersEnv() []string {
	v := strings.TrimSpace(os.Getenv(broker.EnvKafkaBrokers))
	if v == "" {
		return nil
	}
	var addrs []string
	for _, a := range strings.Split(v, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

var (
	exclusiveMu sync.Mutex
	exclusive   = map[string]bool{} // test names holding the exclusive lock
)

// LockKafkaExclusive takes the exclusive lock on the KAFKA_BROKERS cluster until t ends: it
// waits until no other test, in this process or another test binary on this machine, uses the
// cluster (KafkaBrokers holds a shared lock for each test that does), and keeps them waiting
// while t runs. Tests that kill the broker take it, so `go test ./broker/ ./e2e/ ...` running
// packages in parallel does not see the broker vanish under a test that did not ask for it.
// Call it before anything in t calls KafkaBrokers or Config. Under -short it skips t, like
// every helper that needs a service.
func LockKafkaExclusive(t testing.TB) {
	t.Helper()
	SkipShort(t, "the Kafka cluster on "+broker.EnvKafkaBrokers+", exclusively")
	addrs := RealKafka()
	if addrs == nil {
		t.Fatalf("LockKafkaExclusive: %s is not set", broker.EnvKafkaBrokers)
	}
	began := time.Now()
	lockKafka(t, addrs, true)
	exclusiveMu.Lock()
	exclusive[t.Name()] = true
	exclusiveMu.Unlock()
	t.Cleanup(func() {
		exclusiveMu.Lock()
		delete(exclusive, t.Name())
		exclusiveMu.Unlock()
	})
	t.Logf("exclusive use of Kafka at %s (waited %s for other tests to finish with it)", strings.Join(addrs, ","), time.Since(began).Round(time.Millisecond))
}

var lockName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// lockKafka holds an flock(2) on a file named after the cluster, shared or exclusive, until t
// ends. flock locks belong to the open file, so two tests of one process exclude each other
// like two processes do. A test (or its parent) holding the exclusive lock takes no shared one.
func lockKafka(t testing.TB, addrs []string, excl bool) {
	t.Helper()
	if !excl {
		exclusiveMu.Lock()
		for name := range exclusive {
			if t.Name() == name || strings.HasPrefix(t.Name(), name+"/") {
				exclusiveMu.Unlock()
				return
			}
		}
		exclusiveMu.Unlock()
	}
	path := filepath.Join(os.TempDir(), "wmonce-kafka-"+lockName.ReplaceAllString(strings.Join(addrs, ","), "_")+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("Kafka test lock %s: %v", path, err)
	}
	how := syscall.LOCK_SH
	if excl {
		how = syscall.LOCK_EX
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		t.Fatalf("Kafka test lock %s: %v", path, err)
	}
	t.Cleanup(func() { _ = f.Close() }) // closing the file releases the lock
}

// KafkaService returns the e2e/services line (EnvKafkaService) of the broker on
// KAFKA_BROKERS, and fails the test saying what to set when it is missing or unknown. Under
// -short it skips t first: the broker to kill is a service, whatever KAFKA_BROKERS says.
func KafkaService(t testing.TB) string {
	t.Helper()
	SkipShort(t, "a Kafka broker process to kill and restart ("+broker.EnvKafkaBrokers+", "+EnvKafkaService+")")
	line := strings.TrimSpace(os.Getenv(EnvKafkaService))
	switch line {
	case "3.9", "4", "docker": // docker: the compose service, as make test sets it with a Docker engine
		return line
	case "":
		t.Fatalf("%s=%s is set but %s is not: set %s=3.9 (the broker on 127.0.0.1:9092) or %s=4 (127.0.0.1:9094), the e2e/services line of that broker, so this test can kill it with SIGKILL and start it again",
			broker.EnvKafkaBrokers, os.Getenv(broker.EnvKafkaBrokers), EnvKafkaService, EnvKafkaService, EnvKafkaService)
	default:
		t.Fatalf("%s=%q: want 3.9, 4 or docker (the e2e/services line of the broker on %s)", EnvKafkaService, line, broker.EnvKafkaBrokers)
	}
	return ""
}

// ServicesScript is the path of e2e/services in this repository.
func ServicesScript() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return filepath.Join("e2e", "services")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "e2e", "services")
}

// Services runs e2e/services with args and returns its output, or fails the test.
func Services(t testing.TB, args ...string) string {
	t.Helper()
	out, err := services(args...)
	if err != nil {
		t.Fatalf("e2e/services %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func services(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, ServicesScript(), args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// KillKafka kills the broker of line with SIGKILL (e2e/services kafka-kill) and checks
// that KAFKA_BROKERS stopped answering, so a KAFKA_SERVICE naming another broker than
// KAFKA_BROKERS fails here instead of faking the fault. Whatever happens next, the broker is
// started again when t ends (e2e/services kafka-start does nothing if it is running).
func KillKafka(t testing.TB, line string) string {
	t.Helper()
	t.Cleanup(func() {
		if out, err := services("kafka-start", line); err != nil {
			t.Errorf("restarting Kafka %s after the test: %v\n%s", line, err, out)
		}
	})
	out := Services(t, "kafka-kill", line)
	for _, a := range RealKafka() {
		if c, err := (&net.Dialer{Timeout: time.Second}).DialContext(t.Context(), "tcp", a); err == nil {
			_ = c.Close()
			t.Fatalf("%s=%s killed a broker, but %s still answers: %s and %s name different brokers", EnvKafkaService, line, a, EnvKafkaService, broker.EnvKafkaBrokers)
		}
	}
	return out
}

// StartKafka starts the broker of line and waits until it serves (e2e/services
// kafka-start). A start that fails is tried once more, and the failure logged: Kafka 3.9.1
// restarted after SIGKILL has been seen to halt once on a torn tail of its KRaft metadata log
// (CorruptRecordException in __cluster_metadata) and to come up on the next start.
func StartKafka(t testing.TB, line string) string {
	t.Helper()
	out, err := services("kafka-start", line)
	if err == nil {
		return out
	}
	t.Logf("e2e/services kafka-start %s failed, starting it once more: %v\n%s", line, err, out)
	return Services(t, "kafka-start", line)
}

// KafkaVersion describes the cluster at addrs as its ApiVersions answer tells it: franz-go's
// guess of the release from the API version ranges ("v3.9", "v4.4") and the finalized
// metadata.version feature level. Kafka does not send its release over the protocol; the guess
// is exact for Apache Kafka releases franz-go knows, and means little for kfake, whose version
// ranges match no release.
func KafkaVersion(ctx context.Context, addrs []string) (string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		return "", fmt.Errorf("ApiVersions from %s: %w", strings.Join(addrs, ","), err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return "", fmt.Errorf("ApiVersions from %s: %w", strings.Join(addrs, ","), err)
	}
	vs := kversion.FromApiVersionsResponse(resp)
	s := "its ApiVersions answer matches Kafka " + vs.VersionGuess()
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "metadata.version" {
			s += fmt.Sprintf(", metadata.version level %d", f.MaxVersionLevel)
		}
	}
	return s, nil
}

// DeleteCreatedKafkaTopics deletes, when t ends, the topics b created on a KAFKA_BROKERS
// cluster, so runs against a long-lived broker do not pile up topics (each one a log directory
// the broker recovers at every start). Call it after registering b.Close: cleanups run last
// first, so the topics go while b's admin connection is still open. On kfake it does nothing.
func DeleteCreatedKafkaTopics(t testing.TB, b *broker.Broker) {
	if RealKafka() == nil {
		return
	}
	t.Cleanup(func() {
		if topics := b.CreatedKafkaTopics(); len(topics) > 0 {
			if err := b.DeleteKafkaTopics(topics...); err != nil {
				t.Logf("deleting the test's Kafka topics: %v", err)
			}
		}
	})
}
