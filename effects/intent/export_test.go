package intent

// SenderTestSignals are a Sender's test signals (see senderTestSignals).
type SenderTestSignals = senderTestSignals

// TestSignals returns s's test signals: Init the ones a test waits on before s runs.
func (s *Sender) TestSignals() *SenderTestSignals { return &s.testSignals }

// ClaimPendingSQL is the statement with which a Sender of schema claims a ready intent.
func ClaimPendingSQL(schema string) string { return newSenderQueries(schema).claimPending }
