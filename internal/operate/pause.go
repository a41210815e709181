package operate

// PauseRequest is the body of POST /api/pause: Consumer (an inbox consumer, inbox.Ops.Pause)
// or Relay (outbox.PauseRelay), one of them; Pause true pauses, false resumes.
type PauseRequest struct {
	Consumer string `json:"consumer,omitempty"`
	Relay    string `json:"relay,omitempty"`
	Pause    bool   `json:"pause"`
}

// PauseResponse says what POST /api/pause did; Changed is false when the consumer or relay
// was in that state already.
type PauseResponse struct {
	Consumer string `json:"consumer,omitempty"`
	Relay    string `json:"relay,omitempty"`
	Paused   bool   `json:"paused"`
	Changed  bool   `json:"changed"`
}
