package adminbrowser_test

import (
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/ops/admin"
)

// On the page in headless Chromium: the Pause buttons of an inbox consumer and of a relay pause
// them (as the database confirms), the page says since when, and Resume undoes it.
func TestPauseFromThePageInChromium(t *testing.T) {
	t.Parallel()
	ctx, console := browser(t)
	f := admintest.New(t, 1)
	srv := f.Server(t, admin.Config{AllowWrites: true})
	step(t, ctx, "load the page", chromedp.Navigate(srv.URL+"/"))
	waitFor(t, ctx, "the page to load its data", `document.body.dataset.ready === "1"`)

	click(t, ctx, "click Pause on billing", `#inbox-stats tbody tr[data-consumer="billing"] button.pause`)
	waitFor(t, ctx, "the pause message", `document.getElementById("flash").textContent.includes("Paused billing")`)
	require.Equal(t, 1, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("inbox_paused")+` WHERE consumer = 'billing'`))
	waitFor(t, ctx, "billing shown paused", `document.querySelector('#inbox-stats tbody tr[data-consumer="billing"] td.state').textContent.startsWith("paused since")`)

	click(t, ctx, "click Pause on relay sms", `#relays tbody tr[data-relay="sms"] button.pause`)
	waitFor(t, ctx, "the relay pause message", `document.getElementById("flash").textContent.includes("Paused sms")`)
	require.Equal(t, 1, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("outbox_offsets")+` WHERE consumer_group = 'sms' AND paused_at IS NOT NULL`))
	waitFor(t, ctx, "sms shown paused", `document.querySelector('#relays tbody tr[data-relay="sms"] td.state').textContent.startsWith("paused since")`)
	screenshot(t, ctx, "admin-paused.png")

	click(t, ctx, "click Resume on billing", `#inbox-stats tbody tr[data-consumer="billing"] button.resume`)
	waitFor(t, ctx, "the resume message", `document.getElementById("flash").textContent.includes("Resumed billing")`)
	require.Zero(t, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("inbox_paused")))
	// The page redraws its tables after an action: wait for that before the next click, or the
	// click can land on a row being replaced.
	waitFor(t, ctx, "billing shown running", `document.querySelector('#inbox-stats tbody tr[data-consumer="billing"] td.state').textContent.startsWith("running")`)
	click(t, ctx, "click Resume on sms", `#relays tbody tr[data-relay="sms"] button.resume`)
	waitFor(t, ctx, "the relay resume message", `document.getElementById("flash").textContent.includes("Resumed sms")`)
	require.Zero(t, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("outbox_offsets")+` WHERE paused_at IS NOT NULL`))
	waitFor(t, ctx, "both shown running", `document.querySelectorAll('td.state').length === 2 && [...document.querySelectorAll('td.state')].every(td => td.textContent.startsWith("running"))`)

	for _, m := range console() {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			t.Errorf("browser console: %s (%s:%d)", m, m.URL, m.Line)
		}
	}
}
