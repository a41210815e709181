// Package e2e is the end-to-end fault suite of watermill-once: one reusable function, Run, that
// checks the effectively-once guarantee over a real broker while faults are injected (relay
// crashes between publishing and recording its position, consumer processes killed with
// SIGKILL, PostgreSQL connections terminated, broker connections closed, a poison message), in
// the spirit of Watermill's tests.TestPubSub. e2e_test.go runs it for Kafka, RabbitMQ and the
// SQL Pub/Sub.
//
// Running it needs PostgreSQL (DATABASE_URL), RabbitMQ with rabbitmqctl on this machine
// (AMQP_URL; each test gets a virtual host of its own), and either KAFKA_BROKERS or nothing
// (an embedded kfake broker is started in the test process; the consumer processes connect to
// it over TCP). On KAFKA_BROKERS the Kafka run also kills the broker process with SIGKILL
// mid-stream and starts it again through scripts/services, so it needs KAFKA_SERVICE, the line
// of that broker there: KAFKA_BROKERS=127.0.0.1:9092 KAFKA_SERVICE=3.9, or
// KAFKA_BROKERS=127.0.0.1:9094 KAFKA_SERVICE=4 (it fails when KAFKA_SERVICE is missing, and on
// kfake its BrokerSIGKILL subtest is skipped). It holds the cluster exclusively while it runs:
// other Kafka tests on KAFKA_BROKERS, in any test binary on the machine, wait for it
// (internal/brokertest). The default run is a few hundred events per broker; E2E_SOAK=1 runs a longer
// soak (E2E_EVENTS overrides the count).
package e2e
