package broker

// BrokerTestSignals are a Broker's test signals (see brokerTestSignals).
type BrokerTestSignals = brokerTestSignals

// TestSignals returns b's test signals: Init the ones a test waits on before b subscribes.
func (b *Broker) TestSignals() *BrokerTestSignals { return &b.testSignals }

// ValidateGroup is validateGroup, for the name tests.
var ValidateGroup = validateGroup
