package adminbrowser_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/admin"
	"github.com/wmonce/watermill-once/outbox"
)

// downPublisher fails every call, as a broker does for a topic that does not exist.
type downPublisher struct{}

func (downPublisher) Publish(string, ...*message.Message) error {
	return errors.New("kafka server: Request was for a topic or partition that does not exist on this broker")
}
func (downPublisher) Close() error { return nil }

// The outbox writes of the page in headless Chromium: a topic a relay holds is shown, a row
// the broker refused is republished from its detail view, and a retired relay is forgotten
// after a confirmation that says what it had not forwarded. Read-only, none of it shows.
func TestAdminPageOutboxWritesInChromium(t *testing.T) {
	t.Parallel()
	ctx, console := browser(t)
	f := admintest.New(t, 1)
	_, pub := f.KafkaRejects(t, "m-2")
	push, err := outbox.NewRelay(f.DB, downPublisher{}, outbox.RelayConfig{Schema: f.Schema, Name: "push"}, nil)
	require.NoError(t, err)
	admintest.RelayUntil(t, push, "hold topic cashback", func(st outbox.RelayCounters) bool { return st.HeldTopics == 1 })
	var offset int64
	require.NoError(t, f.DB.QueryRow(`SELECT "offset" FROM `+f.Table("outbox_rejected")+` WHERE relay = 'kafka' AND topic = 'cashback'`).Scan(&offset))

	srv := f.Server(t, admin.Config{AllowWrites: true})
	step(t, ctx, "load the page", chromedp.Navigate(srv.URL+"/"))
	waitFor(t, ctx, "the page to load its data", `document.body.dataset.ready === "1"`)
	text := func(sel string) string {
		return step(t, ctx, "read "+sel, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).textContent`, sel)))
	}
	waitFor(t, ctx, "the held topic", `!document.getElementById("held").hidden`)
	require.Contains(t, text("#held"), "Relay push holds topic cashback")
	require.Contains(t, text("#rejected"), "refused them for good")

	// Republish the refused row from its detail view, once the broker takes it.
	pub.Refuse = nil
	rowSel := fmt.Sprintf(`#rejected-rows tbody tr[data-relay="kafka"][data-offset="%d"]`, offset)
	waitFor(t, ctx, "the refused row", fmt.Sprintf(`document.querySelector(%q) !== null`, rowSel))
	require.Contains(t, text(rowSel), "cashback")
	click(t, ctx, "open the refused row", rowSel+` button.link`)
	waitFor(t, ctx, "its detail", `!document.getElementById("detail").hidden && document.querySelector("#detail-actions button.republish") !== null`)
	require.Contains(t, text("#detail-fields"), "cashback")
	require.Contains(t, text("#detail-error"), "too large")
	viewScreenshot(t, ctx, "admin-rejected-republish.png")
	click(t, ctx, "click Republish", `#detail-actions button.republish`)
	waitFor(t, ctx, "the republish message", fmt.Sprintf(`document.getElementById("flash").textContent.includes("Republished row %d")`, offset))
	require.Zero(t, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("outbox_rejected")+` WHERE relay = 'kafka' AND topic = 'cashback'`))
	waitFor(t, ctx, "the row to leave the list", fmt.Sprintf(`document.querySelector(%q) === null`, rowSel))

	// Forget relay push: the dry run says what it holds, the confirmation forgets it.
	step(t, ctx, "choose relay push", chromedp.Evaluate[bool](`(() => { document.getElementById("forget-relay").value = "push"; return true })()`))
	click(t, ctx, "click Forget relay", `#forget-ask`)
	waitFor(t, ctx, "the confirmation", `!document.getElementById("forget-confirm").hidden`)
	require.Contains(t, text("#forget-text"), "1 held topic(s)")
	relays, _, err := outbox.Stats(t.Context(), f.DB, f.Schema)
	require.NoError(t, err)
	require.Len(t, relays, 3, "the dry run forgot nothing")
	screenshot(t, ctx, "admin-forget-relay.png")
	click(t, ctx, "confirm", `#forget-yes`)
	waitFor(t, ctx, "the forget message", `document.getElementById("flash").textContent.includes("Relay push is forgotten")`)
	relays, _, err = outbox.Stats(t.Context(), f.DB, f.Schema)
	require.NoError(t, err)
	for _, r := range relays {
		require.NotEqual(t, "push", r.Name)
	}
	require.Zero(t, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("outbox_held")), "its held rows went with it")
	waitFor(t, ctx, "the held topic to go", `document.getElementById("held").hidden`)

	// Read-only: no write control of the outbox shows.
	ro := f.Server(t, admin.Config{})
	step(t, ctx, "load the read-only page", chromedp.Navigate(ro.URL+"/"))
	waitFor(t, ctx, "the page to load its data", `document.body.dataset.ready === "1"`)
	require.Zero(t, step(t, ctx, "count visible outbox write controls", chromedp.Evaluate[int](
		`[...document.querySelectorAll('#forget-ask, #forget-relay, button.republish')].filter(b => b.offsetParent !== null).length`)))

	for _, m := range console() {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			t.Errorf("browser console: %s (%s:%d)", m, m.URL, m.Line)
		}
	}
}
