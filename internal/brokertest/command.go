package brokertest

// RabbitmqctlCommand returns the command line that runs rabbitmqctl with args, found the way
// Rabbitmqctl finds it, for tests that run it themselves (from a goroutine, or with a context).
func RabbitmqctlCommand(args ...string) []string {
	return append(append(rabbitmqctlCommand(), "-q"), args...)
}
