module github.com/wmonce/watermill-once/internal/embeddedkafka

go 1.26.0

replace github.com/wmonce/watermill-once => ../..

require (
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	github.com/twmb/franz-go v1.22.3 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	golang.org/x/crypto v0.57.0 // indirect
)
