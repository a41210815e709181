package adminbrowser_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/adminhook"
	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/admin"
)

// The charts, the inbox row detail and the rejected row detail in headless Chromium, over rows
// and counts the real components made. The history is drawn by samples taken as if five
// minutes apart during the last hour (adminhook.SampleAt), with real deliveries between them:
// duplicates through the middleware, new PENDING rows through the inbox receiver, outbox rows
// piling up behind the stopped relay. Some claims are moved back in time (processed_at) so
// the claims chart has a past. Each view is saved as a PNG in $ADMIN_SCREENSHOTS.
func TestAdminChartsAndDetailsInChromium(t *testing.T) {
	t.Parallel()
	ctx, console := browser(t)
	f := admintest.New(t, 2)
	srv, h := f.Serve(t, admin.Config{SampleInterval: -1}) // no middlewares: as `wmonce admin`
	bg := context.Background()

	// Claims over the last hour and day: 60 deliveries moved back by up to 23 hours.
	for i := 1; i <= 60; i++ {
		f.Deliver(t, fmt.Sprintf("h-%d", i))
	}
	pgtest.Exec(t, f.DB, `UPDATE `+f.Table("processed_messages")+` SET processed_at = processed_at - make_interval(secs => substr(message_id, 3)::int * 79 + (substr(message_id, 3)::int ^ 2 * 13)::int % 50 + (CASE WHEN substr(message_id, 3)::int > 40 THEN 3600 * (substr(message_id, 3)::int - 40) ELSE 0 END))
		WHERE message_id LIKE 'h-%'`)

	recv, err := inbox.NewReceiver(f.DB, inbox.ReceiverConfig{Schema: f.Schema, Consumer: "billing"}, nil)
	require.NoError(t, err)
	defer recv.Close()
	// A payload that is not UTF-8 and one whose number JavaScript cannot hold exactly.
	require.NoError(t, recv.Handle(message.NewMessage("bin-1", []byte{0xff, 0x00, 0x01, 'o', 'k', 0xc3})))
	require.NoError(t, recv.Handle(message.NewMessage("big-1", []byte(`{"amount":12345678901234567890,"currency":"INR"}`))))

	// Duplicates skipped in the past: a middleware of rewards whose clock says when.
	now := time.Now()
	var mu sync.Mutex
	at := now
	earlier, err := once.New(f.DB, once.Config{Schema: f.Schema, Consumer: "rewards", OutputTopic: "cashback", Now: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return at
	}}, nil)
	require.NoError(t, err)
	duplicate := earlier.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for i := 0; i < 11; i++ {
		mu.Lock()
		at = now.Add(-time.Duration(55-5*i) * time.Minute)
		mu.Unlock()
		for d := 0; d < i%4; d++ {
			_, err := duplicate(message.NewMessage("m-1", []byte(`{"amount":5}`)))
			require.NoError(t, err)
		}
		for p := 0; p < i%3; p++ {
			require.NoError(t, recv.Handle(message.NewMessage(fmt.Sprintf("p-%d-%d", i, p), []byte(`{"invoice":99}`))))
		}
		require.NoError(t, adminhook.SampleAt(bg, h, now.Add(-time.Duration(55-5*i)*time.Minute)))
	}
	require.NoError(t, h.Sample(bg))
	require.NoError(t, earlier.Close()) // writes its duplicates per minute
	require.NoError(t, f.MW.Close())    // and the fixture's one, skipped now

	step(t, ctx, "load the page", chromedp.Navigate(srv.URL+"/"))
	waitFor(t, ctx, "the page to load its data", `document.body.dataset.ready === "1"`)
	count := func(sel string) int {
		return step(t, ctx, "count "+sel, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
	}
	text := func(sel string) string {
		return step(t, ctx, "read "+sel, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).textContent`, sel)))
	}
	require.Equal(t, 2, count("#consumer-charts svg.chart"), "rewards: claims and duplicates")
	require.Greater(t, count("#consumer-charts svg.claims rect.bar"), 10, "claims spread over the hour")
	require.Equal(t, 9, count("#consumer-charts svg.dups rect.bar"), "the minutes duplicates were skipped in: 8 in the past, the fixture's now")
	require.Contains(t, text("#consumer-charts figcaption"), "rewards")
	require.Equal(t, 3, count("#inbox-charts svg.chart"), "billing: pending, failed, oldest age")
	require.Equal(t, 12, count("#inbox-charts svg.pending circle.dot"), "one point per sample")
	require.Equal(t, 2, count("#relay-charts svg.chart"), "sms: lag and backlog")
	require.Contains(t, text("#sampling"), "sampled on demand since")
	require.Contains(t, text("#sampling"), "(12 samples)")
	require.Equal(t, "hour", step(t, ctx, "read the window", chromedp.Evaluate[string](`document.getElementById("consumer-charts").dataset.window`)))
	screenshot(t, ctx, "admin-charts-hour.png")

	click(t, ctx, "show the last day", `#w-day`)
	waitFor(t, ctx, "the day's charts", `document.getElementById("consumer-charts").dataset.window === "day"`)
	require.Contains(t, text("#consumer-charts figcaption"), "in the last day")
	screenshot(t, ctx, "admin-charts-day.png")

	// The consumer filter narrows the charts.
	step(t, ctx, "filter the charts to rewards", chromedp.Evaluate[bool](`(() => { const s = document.getElementById("c-filter"); s.value = "rewards"; s.dispatchEvent(new Event("change")); return true })()`))
	waitFor(t, ctx, "the inbox charts to empty", `document.querySelectorAll('#inbox-charts svg.chart').length === 0`)
	require.Equal(t, 2, count("#consumer-charts svg.chart"))

	// An inbox row parked as FAILED: fields, last error, metadata and the payload indented.
	failed := f.IDs(t, "FAILED")
	click(t, ctx, "open a FAILED row", fmt.Sprintf(`#rows tbody tr[data-id="%d"] td button.link`, failed[0]))
	waitFor(t, ctx, "the inbox row detail", `!document.getElementById("detail").hidden && document.getElementById("detail").dataset.kind === "inbox"`)
	require.Contains(t, text("#detail-title"), fmt.Sprintf("Inbox row %d · billing", failed[0]))
	require.Equal(t, "FAILED", text("#detail-status"))
	require.Equal(t, "card declined: <b>insufficient funds</b>", text("#detail-error"))
	require.Contains(t, text("#detail-metadata"), "fail1")
	require.Contains(t, text("#detail-payload-kind"), "JSON")
	require.Equal(t, "{\n  \"invoice\": 1,\n  \"note\": \"<img src=x onerror=alert(1)>\"\n}", text("#detail-payload"))
	require.Contains(t, text("#detail-fields"), "inv-1")
	require.Zero(t, count("#detail img, #detail b, #detail script"), "producer text stays text")
	viewScreenshot(t, ctx, "admin-inbox-row.png")
	click(t, ctx, "close", `#detail-close`)

	// The rows without a valid UTF-8 or JavaScript-sized payload, through the status filter.
	step(t, ctx, "list PENDING rows of the last 15 minutes", chromedp.Evaluate[bool](`(() => {
		document.getElementById("f-status").value = "PENDING"; document.getElementById("f-since").value = "900";
		document.getElementById("filter").requestSubmit(); return true })()`))
	waitFor(t, ctx, "the PENDING rows", `document.querySelectorAll('#rows tbody tr[data-status="PENDING"]').length > 2`)
	openByMessage := func(id string) {
		step(t, ctx, "open "+id, chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const tr = [...document.querySelectorAll('#rows tbody tr')].find((r) => r.children[1].textContent === %q); tr.querySelector("button.link").click(); return true })()`, id)))
		waitFor(t, ctx, "the detail of "+id, fmt.Sprintf(`!document.getElementById("detail").hidden && document.getElementById("detail-fields").textContent.includes(%q)`, id))
	}
	openByMessage("bin-1")
	require.Contains(t, text("#detail-payload-kind"), "binary, 6 B, hex")
	require.Contains(t, text("#detail-payload"), "00000000  ff 00 01 6f 6b c3")
	click(t, ctx, "close", `#detail-close`)
	waitFor(t, ctx, "the detail to close", `document.getElementById("detail").hidden`)
	openByMessage("big-1")
	require.Contains(t, text("#detail-payload"), `"amount": 12345678901234567890`, "numbers are shown as written")
	click(t, ctx, "close", `#detail-close`)

	// The row the relay set aside.
	waitFor(t, ctx, "the rejected row", `document.querySelectorAll('#rejected-rows tbody tr[data-relay="sms"]').length === 1`)
	click(t, ctx, "open the rejected row", `#rejected-rows tbody tr[data-relay="sms"] button.link`)
	waitFor(t, ctx, "the rejected row detail", `!document.getElementById("detail").hidden && document.getElementById("detail").dataset.kind === "rejected"`)
	require.Contains(t, text("#detail-title"), "relay sms")
	require.Contains(t, text("#detail-fields"), "legacy-7")
	require.Contains(t, text("#detail-error"), "destination_topic")
	require.Contains(t, text("#detail-metadata"), "sourcelegacy-billing")
	require.Contains(t, text("#detail-payload"), "\"lines\": [\n    {\n      \"sku\": \"A-1\",")
	require.Contains(t, text("#detail-payload"), `"note": "<script>alert(1)</script>"`)
	require.Zero(t, count("#detail script, #detail img"))
	viewScreenshot(t, ctx, "admin-rejected-row.png")
	step(t, ctx, "close with Escape", chromedp.KeyEvent("\x1b"))
	waitFor(t, ctx, "the detail to close", `document.getElementById("detail").hidden`)

	// The rejected rows' filter.
	step(t, ctx, "filter rejected rows of the last hour", chromedp.Evaluate[bool](`(() => {
		document.getElementById("r-relay").value = "sms"; document.getElementById("r-since").value = "3600";
		document.getElementById("r-filter").requestSubmit(); return true })()`))
	waitFor(t, ctx, "one rejected row", `document.querySelectorAll('#rejected-rows tbody tr[data-relay="sms"]').length === 1`)

	for _, m := range console() {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			t.Errorf("browser console: %s (%s:%d)", m, m.URL, m.Line)
		}
	}
}
