package operate

import "time"

// HistoryResponse is GET /api/history: the charts of one window. Every series has Buckets
// values, the i-th covering [Start + i*BucketSeconds, Start + (i+1)*BucketSeconds); null means
// no sample covers that bucket (before sampling began, or the part could not be read).
type HistoryResponse struct {
	Window        string    `json:"window"`
	Start         time.Time `json:"start"`
	End           time.Time `json:"end"`
	BucketSeconds float64   `json:"bucket_seconds"`
	Buckets       int       `json:"buckets"`
	// Sampling describes the in-memory samples behind the inbox and relay series.
	Sampling SamplingStatus `json:"sampling"`
	// InProcessCounters says whether middlewares were given (Config.Middlewares). The charts no
	// longer need them: claims and duplicates come from the database.
	InProcessCounters bool             `json:"in_process_counters"`
	Consumers         []ConsumerSeries `json:"consumers"`
	Inbox             []InboxSeries    `json:"inbox"`
	Relays            []RelaySeries    `json:"relays"`
}

// SamplingStatus says how far back the sampled series go.
type SamplingStatus struct {
	// IntervalSeconds is Config.SampleInterval (0 when background sampling is off).
	IntervalSeconds float64 `json:"interval_seconds"`
	// Since is the first sample this handler took (nil, null in JSON, before the first).
	Since *time.Time `json:"since"`
	// Samples counts the samples taken since the handler started.
	Samples int64 `json:"samples"`
}

// ConsumerSeries is one consumer's claims and duplicates per bucket, both from the database
// (claims.ClaimHistory, claims.DuplicateHistory: every process's). Duplicates is never null; the
// type is kept from when it was sampled.
type ConsumerSeries struct {
	Consumer   string   `json:"consumer"`
	Claims     []int64  `json:"claims"`
	Duplicates []*int64 `json:"duplicates"`
}

// InboxSeries is one inbox consumer's sampled backlog per bucket (largest sample in the bucket).
type InboxSeries struct {
	Consumer                string     `json:"consumer"`
	Pending                 []*int64   `json:"pending"`
	Failed                  []*int64   `json:"failed"`
	OldestPendingAgeSeconds []*float64 `json:"oldest_pending_age_seconds"`
}

// RelaySeries is one relay's sampled backlog and lag per bucket (largest sample in the bucket).
type RelaySeries struct {
	Name       string     `json:"name"`
	Backlog    []*int64   `json:"backlog"`
	LagSeconds []*float64 `json:"lag_seconds"`
}
