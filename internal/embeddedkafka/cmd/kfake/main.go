// Command kfake serves the embedded Kafka broker (internal/embeddedkafka, franz-go's kfake) on
// a fixed port until it is interrupted, so that test binaries of the library module, which
// does not require kfake, can run their Kafka tests on it:
//
//	go run ./cmd/kfake -port 9096 &   # in internal/embeddedkafka
//	KAFKA_BROKERS=127.0.0.1:9096 KAFKA_EMBEDDED=1 go test -run Kafka ./broker/
//
// .ci/run's kfake pass does this. It prints "kfake listening on ADDR" once it accepts
// connections.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/wmonce/watermill-once/internal/embeddedkafka"
)

func main() {
	port := flag.Int("port", 9096, "TCP port on 127.0.0.1")
	flag.Parse()
	if *port < 1 || *port > 65535 {
		fmt.Fprintf(os.Stderr, "kfake: -port %d: want a TCP port, 1 to 65535\n", *port)
		os.Exit(2)
	}
	if err := serve(*port); err != nil {
		fmt.Fprintln(os.Stderr, "kfake:", err)
		os.Exit(1)
	}
}

// serve runs the broker on port until SIGINT or SIGTERM.
func serve(port int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := embeddedkafka.StartOn(ctx, nil, port)
	if err != nil {
		return err
	}
	defer b.Close()
	fmt.Println("kfake listening on", strings.Join(b.Addrs(), ","))
	<-ctx.Done()
	return nil
}
