package main

import (
	"bufio"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/broker"
)

// What docker-compose.yml and examples/payments/Dockerfile can be checked for on a machine
// without a Docker engine: the compose file loads and validates with the Compose
// specification's own loader (compose-go, the library the docker compose CLI uses), each
// service has the image, ports, environment and healthcheck the README and the tests expect,
// and the demo binary builds with the Dockerfile's own go build line. Not checked here: that
// the images can be pulled, that the healthchecks pass inside the containers, and that the
// containers reach each other on the compose network (kafka:29092, postgres:5432,
// rabbitmq:5672).

const repoRoot = "../.."

// loadCompose loads docker-compose.yml as `docker compose config` would, with interpolation,
// normalization and the schema and consistency checks on, and no variables from this
// machine's environment.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{filepath.Join(repoRoot, "docker-compose.yml")},
		cli.WithWorkingDirectory(repoRoot), cli.WithEnv(nil), cli.WithConsistency(true))
	require.NoError(t, err)
	p, err := opts.LoadProject(context.Background())
	require.NoError(t, err, "docker-compose.yml does not load as a Compose project")
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	require.NoError(t, err, "docker-compose.yml has no service %q", name)
	return s
}

func env(t *testing.T, s types.ServiceConfig, key string) string {
	t.Helper()
	v, ok := s.Environment[key]
	require.True(t, ok && v != nil, "service %s: environment %s is not set", s.Name, key)
	return *v
}

// publishes reports whether s publishes container port on the same host port.
func publishes(s types.ServiceConfig, port uint32) bool {
	return slices.ContainsFunc(s.Ports, func(p types.ServicePortConfig) bool {
		return p.Target == port && p.Published == strconv.FormatUint(uint64(port), 10)
	})
}

// servicesScriptVar returns NAME's default in e2e/services (NAME=${NAME:-value} or NAME=value).
func servicesScriptVar(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "e2e", "services"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^` + name + `=(?:\$\{` + name + `:-([^}]+)\}|([^\s#]+))`).FindStringSubmatch(string(b))
	require.NotNil(t, m, "e2e/services defines no %s", name)
	return m[1] + m[2]
}

func TestComposeFile(t *testing.T) {
	p := loadCompose(t)
	require.ElementsMatch(t, []string{"postgres", "kafka", "rabbitmq", "demo", "connect-1", "connect-2"}, p.ServiceNames())

	healthy := func(s types.ServiceConfig) {
		t.Helper()
		require.NotNil(t, s.HealthCheck, "service %s has no healthcheck (demo waits for service_healthy)", s.Name)
		require.NotEmpty(t, s.HealthCheck.Test, "service %s: empty healthcheck", s.Name)
		require.False(t, s.HealthCheck.Disable, "service %s: healthcheck disabled", s.Name)
	}

	t.Run("postgres", func(t *testing.T) {
		s := service(t, p, "postgres")
		require.Equal(t, "postgres:16", s.Image, "README: PostgreSQL 16")
		require.True(t, publishes(s, 5432), "the tests' default DATABASE_URL is 127.0.0.1:5432: %+v", s.Ports)
		// The tests' default URL (pgtx.DefaultDatabaseURL) has no password and database test.
		require.Equal(t, "trust", env(t, s, "POSTGRES_HOST_AUTH_METHOD"))
		require.Equal(t, "test", env(t, s, "POSTGRES_DB"))
		require.Equal(t, "postgres", env(t, s, "POSTGRES_USER"))
		require.Contains(t, strings.Join(s.Command, " "), "max_connections=300", "the same max_connections as e2e/services")
		require.Contains(t, strings.Join(s.Command, " "), "wal_level=logical", "Debezium's connector reads the WAL, as with e2e/services")
		healthy(s)
		require.Contains(t, strings.Join(s.HealthCheck.Test, " "), "pg_isready")
	})

	t.Run("kafka", func(t *testing.T) {
		s := service(t, p, "kafka")
		require.Equal(t, "apache/kafka:"+servicesScriptVar(t, "KAFKA_39_VERSION"), s.Image,
			"the compose Kafka is the 3.9 line e2e/services runs for the tests (KAFKA_39_VERSION)")
		require.True(t, publishes(s, 9092), "KAFKA_BROKERS=localhost:9092 from the host: %+v", s.Ports)
		require.Equal(t, servicesScriptVar(t, "KAFKA_CLUSTER_ID"), env(t, s, "CLUSTER_ID"))
		require.Equal(t, "broker,controller", env(t, s, "KAFKA_PROCESS_ROLES"))
		listeners := env(t, s, "KAFKA_LISTENERS")
		advertised := env(t, s, "KAFKA_ADVERTISED_LISTENERS")
		require.Contains(t, listeners, "EXTERNAL://:9092")
		require.Contains(t, advertised, "EXTERNAL://localhost:9092", "the host reaches the advertised address")
		require.Contains(t, listeners, "INTERNAL://:29092")
		require.Contains(t, advertised, "INTERNAL://kafka:29092", "other containers reach the advertised address")
		require.Equal(t, "false", env(t, s, "KAFKA_AUTO_CREATE_TOPICS_ENABLE"), "topics are created by package broker")
		for _, k := range []string{"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_MIN_INSYNC_REPLICAS"} {
			require.Equal(t, "1", env(t, s, k), "one node cannot replicate")
		}
		healthy(s)
		require.Contains(t, strings.Join(s.HealthCheck.Test, " "), "kafka:29092", "the healthcheck asks the listener the demo uses")
	})

	t.Run("rabbitmq", func(t *testing.T) {
		s := service(t, p, "rabbitmq")
		require.True(t, strings.HasPrefix(s.Image, "rabbitmq:"), s.Image)
		require.True(t, publishes(s, 5672), "the tests' default AMQP_URL is %s: %+v", broker.DefaultAMQPURL, s.Ports)
		healthy(s)
	})

	t.Run("connect", func(t *testing.T) {
		// Two workers of one Connect cluster (issue 23): one group, the same storage topics,
		// exactly-once source support, a dead worker's task moved after 5 s.
		for _, name := range []string{"connect-1", "connect-2"} {
			s := service(t, p, name)
			require.Equal(t, "wmonce-connect", env(t, s, "GROUP_ID"), name)
			require.Equal(t, "wmonce-connect-configs", env(t, s, "CONFIG_STORAGE_TOPIC"), name)
			require.Equal(t, "enabled", env(t, s, "CONNECT_EXACTLY_ONCE_SOURCE_SUPPORT"), name)
			require.Equal(t, "5000", env(t, s, "CONNECT_SCHEDULED_REBALANCE_MAX_DELAY_MS"), name)
			require.Equal(t, "kafka:29092", env(t, s, "BOOTSTRAP_SERVERS"), name)
			require.Equal(t, name, env(t, s, "ADVERTISED_HOST_NAME"))
		}
	})

	t.Run("demo", func(t *testing.T) {
		s := service(t, p, "demo")
		require.NotNil(t, s.Build)
		ctxDir, err := filepath.Abs(repoRoot)
		require.NoError(t, err)
		require.Equal(t, ctxDir, s.Build.Context, "the build context is the repository root")
		require.Equal(t, "examples/payments/Dockerfile", s.Build.Dockerfile)
		require.FileExists(t, filepath.Join(repoRoot, s.Build.Dockerfile))

		dbURL := env(t, s, broker.EnvDatabaseURL)
		require.Regexp(t, `^postgres://postgres(:[^@]*)?@postgres:5432/test(\?|$)`, dbURL, "the compose postgres service and its database")
		kafka := service(t, p, "kafka")
		require.Equal(t, "kafka:29092", env(t, s, broker.EnvKafkaBrokers))
		require.Contains(t, env(t, kafka, "KAFKA_ADVERTISED_LISTENERS"), "://"+env(t, s, broker.EnvKafkaBrokers))
		require.Equal(t, "1", env(t, s, broker.EnvKafkaReplication))
		require.Regexp(t, `^amqp://guest:guest@rabbitmq:5672/`, env(t, s, broker.EnvAMQPURL))

		entry := strings.Join(s.Entrypoint, " ")
		require.Contains(t, entry, "/usr/local/bin/payments", "the binary the Dockerfile installs")
		for _, k := range broker.Kinds {
			require.Regexp(t, `for b in [a-z ]*\b`+string(k)+`\b`, entry, "the demo runs on every broker")
		}
		for _, dep := range []string{"postgres", "kafka", "rabbitmq"} {
			d, ok := s.DependsOn[dep]
			require.True(t, ok, "demo does not depend on %s", dep)
			require.Equal(t, types.ServiceConditionHealthy, d.Condition, "demo waits for %s to be healthy", dep)
		}
	})
}

// dockerfile is what the tests read from examples/payments/Dockerfile.
type dockerfile struct {
	buildImage string   // FROM of the build stage
	workdir    string   // the last WORKDIR before go build, under /src (the build context)
	buildEnv   []string // NAME=value before go build
	buildArgs  []string // go build's arguments
	output     string   // its -o
	installs   string   // COPY --from=build <output> <installs>
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	f, err := os.Open("Dockerfile")
	require.NoError(t, err)
	defer f.Close()
	var d dockerfile
	var runs int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			if len(fields) == 4 && strings.EqualFold(fields[2], "AS") && fields[3] == "build" {
				d.buildImage = fields[1]
			}
		case "WORKDIR":
			if runs == 0 && len(fields) == 2 {
				d.workdir = fields[1]
			}
		case "RUN":
			i := slices.Index(fields, "go")
			if i < 0 || i+1 >= len(fields) || fields[i+1] != "build" {
				continue
			}
			runs++
			require.NotContains(t, sc.Text(), `"`, "the go build line is split on spaces: keep it free of quotes")
			require.NotContains(t, sc.Text(), `'`, "the go build line is split on spaces: keep it free of quotes")
			d.buildEnv = fields[1:i]
			for _, e := range d.buildEnv {
				require.Contains(t, e, "=", "RUN %s: only NAME=value before go build", strings.Join(fields[1:], " "))
			}
			d.buildArgs = fields[i+2:]
			o := slices.Index(d.buildArgs, "-o")
			require.True(t, o >= 0 && o+1 < len(d.buildArgs), "go build has no -o")
			d.output = d.buildArgs[o+1]
		case "COPY":
			if len(fields) == 4 && fields[1] == "--from=build" {
				d.installs = fields[3]
				require.Equal(t, d.output, fields[2], "the final stage copies what go build wrote")
			}
		}
	}
	require.NoError(t, sc.Err())
	require.Equal(t, 1, runs, "one RUN ... go build line in the Dockerfile")
	return d
}

// TestDockerfileBuild builds the demo with the Dockerfile's own go build line (its
// environment and flags; the output redirected to a temporary directory) from the repository
// folder its WORKDIR names under the repository root (the build context; examples/, the
// examples' module), and checks the result is what the runtime stage needs:
// a static binary, since that stage is a plain Debian image without Go or C libraries beyond
// libc. It also checks that the build image's Go matches the go line of the go.mod it builds with.
func TestDockerfileBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the demo from scratch with the Dockerfile's flags (seconds to minutes): the full suite runs it, not -short")
	}
	d := readDockerfile(t)
	require.True(t, strings.HasPrefix(d.workdir, "/src/") || d.workdir == "/src", "WORKDIR %q: want /src (the build context) or a folder under it", d.workdir)
	dir := filepath.Join(repoRoot, strings.TrimPrefix(d.workdir, "/src"))

	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	require.NotNil(t, m, "go.mod has no go line")
	require.True(t, strings.HasPrefix(d.buildImage, "golang:"+string(m[1])+"-"), "build stage %q: want golang:%s-*, the Go of go.mod", d.buildImage, m[1])
	require.Equal(t, "/usr/local/bin/payments", d.installs, "docker-compose.yml's demo runs /usr/local/bin/payments")
	require.Contains(t, d.buildEnv, "CGO_ENABLED=0")

	out := filepath.Join(t.TempDir(), "payments")
	args := slices.Clone(d.buildArgs)
	args[slices.Index(args, "-o")+1] = out
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), d.buildEnv...)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s (in %s): %s", strings.Join(d.buildEnv, " "), strings.Join(cmd.Args, " "), cmd.Dir, b)
	t.Logf("built as the Dockerfile does: %s %s", strings.Join(d.buildEnv, " "), strings.Join(cmd.Args, " "))

	bin, err := elf.Open(out)
	require.NoError(t, err)
	defer bin.Close()
	for _, p := range bin.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "the binary is dynamically linked; the runtime stage expects a static one")
	}
}
