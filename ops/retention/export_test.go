package retention

// JanitorTestSignals are a Janitor's test signals (see janitorTestSignals).
type JanitorTestSignals = janitorTestSignals

// TestSignals returns j's test signals: Init the ones a test waits on before j runs.
func (j *Janitor) TestSignals() *JanitorTestSignals { return &j.testSignals }
