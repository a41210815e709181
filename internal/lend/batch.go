package lend

import "github.com/ThreeDotsLabs/watermill/message"

// Settled counts and reports a handler that acked or nacked own, the message it was lent for
// d, as Handle does: for a batch handler (middleware/once.BatchHandler), which gets its
// messages after Handle has returned.
func (s *Step) Settled(own *message.Message, d Delivery) { s.settledByHandler(own, d) }
