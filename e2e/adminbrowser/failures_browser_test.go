package adminbrowser_test

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/outbox"
)

// The failure groups on the page in headless Chromium: the parked inbox rows are one group,
// replayed after a dry run that lists their ids; a rejected outbox group is discarded after
// its own confirmation; a message the poison queue parked is replayed to the topic it came
// from. The database confirms each. Read-only, no action shows.
func TestAdminPageFailureGroupsInChromium(t *testing.T) {
	t.Parallel()
	ctx, console := browser(t)
	f := admintest.New(t, 4)
	f.KafkaRejects(t, "m-2")
	w, err := outbox.NewWriter(outbox.Config{Schema: f.Schema})
	require.NoError(t, err)
	poisoned := message.NewMessage("evt-17", []byte(`{}`))
	poisoned.Metadata.Set(middleware.ReasonForPoisonedKey, "permanent: unknown currency XYZ")
	poisoned.Metadata.Set(middleware.PoisonedTopicKey, "payments")
	poisoned.Metadata.Set(middleware.PoisonedHandlerKey, "ledger")
	require.NoError(t, w.ParkingPublisher(f.DB).Publish("payments-poison", poisoned))
	srv := f.Server(t, admin.Config{AllowWrites: true})
	resp, err := operate.ReadFailureGroups(t.Context(), f.DB, f.Schema, operate.DefaultFailureGroupRows)
	require.NoError(t, err)
	groups := resp.Groups
	billing := admintest.FailureGroup(t, groups, operate.FailureKindInbox, "billing", "")
	cashback := admintest.FailureGroup(t, groups, operate.FailureKindRejected, "kafka", "cashback")
	parked := admintest.FailureGroup(t, groups, operate.FailureKindParked, "ledger", "payments")

	step(t, ctx, "load the page", chromedp.Navigate(srv.URL+"/"))
	waitFor(t, ctx, "the page to load its data", `document.body.dataset.ready === "1"`)
	waitFor(t, ctx, "the five groups", `document.querySelectorAll('#failure-groups tbody tr[data-fingerprint]').length === 5`)
	text := func(sel string) string {
		return step(t, ctx, "read "+sel, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).textContent`, sel)))
	}
	billingRow := fmt.Sprintf(`#failure-groups tbody tr[data-fingerprint=%q]`, billing.Fingerprint)
	require.Contains(t, text(billingRow), "card declined: <b>insufficient funds</b>", "producer text is shown as text")
	require.Contains(t, text(billingRow), "billing")
	require.Zero(t, step(t, ctx, "count injected elements", chromedp.Evaluate[int](`document.querySelectorAll('#failure-groups b').length`)))
	screenshot(t, ctx, "admin-failure-groups.png")

	// Replay the inbox group: the dry run lists exactly its rows.
	click(t, ctx, "click Replay on the billing group", billingRow+` button.g-replay`)
	waitFor(t, ctx, "the confirmation", `!document.getElementById("g-confirm").hidden`)
	require.Contains(t, text("#g-confirm-text"), "4 inbox row(s) of consumer billing")
	ids := f.IDs(t, "FAILED")
	require.Len(t, ids, 4)
	require.Equal(t, fmt.Sprintf("Row ids: %d, %d, %d, %d", ids[0], ids[1], ids[2], ids[3]), text("#g-confirm-ids"))
	require.Equal(t, 4, f.Count(t, "FAILED"), "the dry run changed nothing")
	screenshot(t, ctx, "admin-failure-group-confirm.png")
	click(t, ctx, "confirm", `#g-yes`)
	waitFor(t, ctx, "the replay message", fmt.Sprintf(`document.getElementById("flash").textContent.includes("Replay: 4 row(s) of group %s changed")`, billing.Fingerprint))
	require.Equal(t, 0, f.Count(t, "FAILED"))
	require.Equal(t, 4, f.Count(t, "PENDING"))
	waitFor(t, ctx, "the group to leave the list", fmt.Sprintf(`document.querySelector(%q) === null`, billingRow))

	// Discard the rejected group of topic cashback.
	cashbackRow := fmt.Sprintf(`#failure-groups tbody tr[data-fingerprint=%q]`, cashback.Fingerprint)
	click(t, ctx, "click Discard on the cashback group", cashbackRow+` button.g-discard`)
	waitFor(t, ctx, "the confirmation", `!document.getElementById("g-confirm").hidden`)
	require.Contains(t, text("#g-confirm-text"), "1 rejected outbox row(s) of relay kafka on topic cashback will be deleted")
	require.Equal(t, 3, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("outbox_rejected")), "the dry run deleted nothing")
	click(t, ctx, "confirm", `#g-yes`)
	waitFor(t, ctx, "the discard message", `document.getElementById("flash").textContent.includes("Discard: 1 row(s)")`)
	require.Zero(t, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("outbox_rejected")+` WHERE topic = 'cashback'`))
	require.Equal(t, 2, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("outbox_rejected")), "the undecodable rows stay")
	waitFor(t, ctx, "three groups left", `document.querySelectorAll('#failure-groups tbody tr[data-fingerprint]').length === 3`)

	// Replay the parked message: it is stored again for the topic it was consumed from.
	parkedRow := fmt.Sprintf(`#failure-groups tbody tr[data-fingerprint=%q]`, parked.Fingerprint)
	require.Contains(t, text(parkedRow), "parked (poison queue)")
	click(t, ctx, "click Replay on the parked group", parkedRow+` button.g-replay`)
	waitFor(t, ctx, "the confirmation", `!document.getElementById("g-confirm").hidden`)
	require.Contains(t, text("#g-confirm-text"), "1 parked message(s) of handler ledger on topic payments will be stored in the outbox again")
	click(t, ctx, "confirm", `#g-yes`)
	waitFor(t, ctx, "the parked replay message", fmt.Sprintf(`document.getElementById("flash").textContent.includes("Replay: 1 row(s) of group %s changed")`, parked.Fingerprint))
	require.Equal(t, 1, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("outbox")+` WHERE uuid = 'evt-17' AND payload->>'destination_topic' = 'payments'`))
	waitFor(t, ctx, "two groups left", `document.querySelectorAll('#failure-groups tbody tr[data-fingerprint]').length === 2`)
	waitFor(t, ctx, "the outbox section to count 2 rejected rows", `document.getElementById("rejected").textContent.startsWith("2 outbox row(s)")`)
	screenshot(t, ctx, "admin-failure-groups-after.png")

	ro := f.Server(t, admin.Config{})
	step(t, ctx, "load the read-only page", chromedp.Navigate(ro.URL+"/"))
	waitFor(t, ctx, "the groups", `document.body.dataset.ready === "1" && document.querySelectorAll('#failure-groups tbody tr[data-fingerprint]').length === 2`)
	require.Zero(t, step(t, ctx, "count visible group actions", chromedp.Evaluate[int](
		`[...document.querySelectorAll('#failure-groups button, #g-confirm')].filter(b => b.offsetParent !== null).length`)))

	for _, m := range console() {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			t.Errorf("browser console: %s (%s:%d)", m, m.URL, m.Line)
		}
	}
}
