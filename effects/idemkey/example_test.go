package idemkey_test

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/effects/idemkey"
)

func ExampleDerive() {
	charge, _ := idemkey.Derive("payments-charger", "pay-42", "charge")
	receipt, _ := idemkey.Derive("payments-charger", "pay-42", "receipt-email")
	asUUID, _ := idemkey.DeriveUUID("payments-charger", "pay-42", "charge")
	fmt.Println(charge)
	fmt.Println(receipt)
	fmt.Println(asUUID)
	// Output:
	// 769a949d4c4b4f03babf39215a62ca9522f2e289ab5288e07b6ea5b88a41dc61
	// e5491720aeae06f811a3d10e44031f80fee51ceb01e9d323591785c3ec4563a2
	// 769a949d-4c4b-8f03-babf-39215a62ca95
}

// A handler inside the effectively-once middleware calls a provider with a key that is the
// same on every redelivery of the message.
func ExampleTransport() {
	transport, err := idemkey.NewTransport(http.DefaultTransport, idemkey.TransportConfig{})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: transport}

	handler := func(msg *message.Message) error {
		key, err := idemkey.ForMessage(msg, "charge") // router handler name + message UUID + step
		if err != nil {
			return err
		}
		ctx := idemkey.WithKey(msg.Context(), key)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://provider.example/v1/charges", strings.NewReader(`{"amount":2400}`))
		resp, err := client.Do(req) // sent with Idempotency-Key: <key>
		if err != nil {
			return err // nack: the redelivery sends the same key
		}
		defer resp.Body.Close()
		// ... store the provider's answer with pgtx.TxFromContext(msg.Context()) ...
		return nil
	}
	_ = handler
}
