package adminbrowser_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/admintest"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/admin"
)

// chromiumInstall is what to run when the browser test finds no Chromium.
const chromiumInstall = "apt-get install -y --no-install-recommends chromium"

// findChromium returns the browser to drive: $CHROMIUM_PATH, or chromium from PATH. The test
// fails without one (it skips only under -short, which runs no service).
func findChromium(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs headless Chromium (CHROMIUM_PATH or chromium on PATH): skipped under -short")
	}
	if p := os.Getenv("CHROMIUM_PATH"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("CHROMIUM_PATH=%s: %v: point it at a Chromium binary, or install one (Debian: `%s`)", p, err, chromiumInstall)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("the admin page test needs headless Chromium and found none in PATH: install it (Debian: `%s`) or set CHROMIUM_PATH", chromiumInstall)
	return ""
}

// browser starts a headless Chromium for the test and returns a tab context and the console
// messages seen so far.
func browser(t *testing.T) (context.Context, func() []chromedp.ConsoleMessage) {
	t.Helper()
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(findChromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(cancel)
	// Start the browser (the first Run) before any deadline: a timeout on it would end the
	// browser, not one step.
	_, err := chromedp.Run(ctx, chromedp.Evaluate[int]("1"))
	require.NoError(t, err, "start Chromium")

	var mu sync.Mutex
	var seen []chromedp.ConsoleMessage
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			mu.Lock()
			seen = append(seen, m)
			mu.Unlock()
		}
	}()
	return ctx, func() []chromedp.ConsoleMessage {
		mu.Lock()
		defer mu.Unlock()
		return append([]chromedp.ConsoleMessage(nil), seen...)
	}
}

// step runs one browser action with its own deadline.
func step[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	require.NoError(t, err, what)
	return v
}

// waitFor polls a JavaScript predicate in the page.
func waitFor(t *testing.T, ctx context.Context, what, predicate string) {
	t.Helper()
	step(t, ctx, "wait for "+what, chromedp.Poll[bool](predicate, chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(8*time.Second)))
}

// screenshot saves the whole page as name in $ADMIN_SCREENSHOTS (default: a temporary
// directory) and logs the path.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	savePNG(t, name, step(t, ctx, "screenshot", chromedp.FullScreenshot(100)))
}

// viewScreenshot saves what the window shows (a dialog over the page).
func viewScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	savePNG(t, name, step(t, ctx, "screenshot", chromedp.CaptureScreenshot()))
}

func savePNG(t *testing.T, name string, png []byte) {
	t.Helper()
	dir := os.Getenv("ADMIN_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

// The page is loaded in headless Chromium against rows a real Processor parked: it shows
// them, a click on Replay puts one back to PENDING, and the bulk replay (dry run, then
// confirm) puts back the rest, as the database confirms.
func TestAdminPageInChromium(t *testing.T) {
	t.Parallel()
	ctx, console := browser(t)
	f := admintest.New(t, 5)
	srv := f.Server(t, admin.Config{AllowWrites: true, Middlewares: []*once.Middleware{f.MW}})

	step(t, ctx, "load the page", chromedp.Navigate(srv.URL+"/"))
	waitFor(t, ctx, "the page to load its data", `document.body.dataset.ready === "1"`)
	waitFor(t, ctx, "the FAILED rows", `document.querySelectorAll('#rows tbody tr[data-status="FAILED"]').length === 5`)

	text := func(sel string) string {
		return step(t, ctx, "read "+sel, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).textContent`, sel)))
	}
	require.Contains(t, text("#mode"), "writes enabled")
	require.Contains(t, text("#schema"), "schema "+f.Schema)
	consumers := text("#consumers tbody")
	require.Contains(t, consumers, "rewards")
	require.Equal(t, []string{"rewards", "3", "3", "1", "25.0 %", "0", "0", "0", "0"}, step(t, ctx, "read the consumer row", chromedp.Evaluate[[]string](
		`[...document.querySelectorAll('#consumers tbody td')].filter((_, i) => i !== 2).map(td => td.textContent)`)),
		"3 claims, 3 fresh, 1 duplicate: 25% of 4 deliveries; no failure, delayed retry, refusal or message too old")
	stats := text("#inbox-stats tbody")
	require.Contains(t, stats, "billing")
	require.Contains(t, text("#relays tbody"), "sms")
	// Producer-controlled text is shown as text, never parsed as HTML.
	require.Contains(t, text("#rows tbody td.err"), "card declined: <b>insufficient funds</b>")
	require.Zero(t, step(t, ctx, "count injected elements", chromedp.Evaluate[int](`document.querySelectorAll('#rows b, #detail img').length`)))
	screenshot(t, ctx, "admin-failed-rows.png")

	// Replay one row with its own button.
	ids := f.IDs(t, "FAILED")
	require.Len(t, ids, 5)
	click(t, ctx, "click Replay on the first row", fmt.Sprintf(`#rows tbody tr[data-id="%d"] button.replay`, ids[0]))
	waitFor(t, ctx, "the replay message", fmt.Sprintf(`document.getElementById("flash").textContent.includes("Replayed row %d")`, ids[0]))
	require.Equal(t, "PENDING", f.RowStatus(t, ids[0]))
	waitFor(t, ctx, "the row to leave the FAILED list", `document.querySelectorAll('#rows tbody tr[data-status="FAILED"]').length === 4`)

	// Skip the last row: the button asks for a reason first.
	row := fmt.Sprintf(`#rows tbody tr[data-id="%d"] `, ids[3])
	click(t, ctx, "click Skip", row+`button.skip`)
	step(t, ctx, "type the reason", chromedp.SendKeys(chromedp.CSS(row+`input.skip-reason`), "paid by bank transfer"))
	click(t, ctx, "confirm the skip", row+`button.skip-confirm`)
	waitFor(t, ctx, "the skip message", fmt.Sprintf(`document.getElementById("flash").textContent.includes("Skipped row %d")`, ids[3]))
	require.Equal(t, "SKIPPED", f.RowStatus(t, ids[3]))
	require.Equal(t, 1, pgtest.Count(t, f.DB, `SELECT count(*) FROM `+f.Table("inbox")+` WHERE id = $1 AND last_error LIKE 'skipped: paid by bank transfer%'`, ids[3]))
	waitFor(t, ctx, "three FAILED rows left", `document.querySelectorAll('#rows tbody tr[data-status="FAILED"]').length === 3`)

	// Inspect a row: the payload is shown as text.
	click(t, ctx, "open a row", fmt.Sprintf(`#rows tbody tr[data-id="%d"] td button.link`, ids[1]))
	waitFor(t, ctx, "the row detail", `!document.getElementById("detail").hidden`)
	require.Contains(t, text("#detail-body"), `<img src=x onerror=alert(1)>`)
	click(t, ctx, "close the row", `#detail-close`)
	waitFor(t, ctx, "the detail to close", `document.getElementById("detail").hidden`)

	// Skip a row from its detail view: the reason box opens in the dialog.
	click(t, ctx, "open another row", fmt.Sprintf(`#rows tbody tr[data-id="%d"] td button.link`, ids[4]))
	waitFor(t, ctx, "its detail", fmt.Sprintf(`!document.getElementById("detail").hidden && document.getElementById("detail-title").textContent.includes("Inbox row %d")`, ids[4]))
	click(t, ctx, "click Skip in the detail", `#detail-actions button.skip`)
	step(t, ctx, "type the reason", chromedp.SendKeys(chromedp.CSS(`#detail-actions input.skip-reason`), "duplicate invoice"))
	click(t, ctx, "confirm the skip", `#detail-actions button.skip-confirm`)
	waitFor(t, ctx, "the skip message", fmt.Sprintf(`document.getElementById("flash").textContent.includes("Skipped row %d")`, ids[4]))
	require.Equal(t, "SKIPPED", f.RowStatus(t, ids[4]))
	waitFor(t, ctx, "the detail to close after the change", `document.getElementById("detail").hidden`)
	waitFor(t, ctx, "two FAILED rows left", `document.querySelectorAll('#rows tbody tr[data-status="FAILED"]').length === 2`)

	// Bulk replay: the dry run says how many rows, the confirmation replays them.
	click(t, ctx, "click Replay matching rows", `#replay-all`)
	waitFor(t, ctx, "the confirmation", `!document.getElementById("confirm").hidden`)
	require.Contains(t, text("#confirm-text"), "2 FAILED row(s) of billing will run again")
	require.Equal(t, 2, f.Count(t, "FAILED"), "the dry run changed nothing")
	screenshot(t, ctx, "admin-confirm-replay.png")
	click(t, ctx, "confirm", `#confirm-yes`)
	waitFor(t, ctx, "the bulk replay message", `document.getElementById("flash").textContent.includes("Replayed 2 row(s)")`)

	require.Equal(t, 0, f.Count(t, "FAILED"))
	require.Equal(t, 3, f.Count(t, "PENDING"))
	require.Equal(t, 2, f.Count(t, "SKIPPED"))
	require.Equal(t, 1, f.Count(t, "DONE"))
	// The page shows the new state.
	waitFor(t, ctx, "the empty FAILED list", `!document.getElementById("rows-empty").hidden`)
	waitFor(t, ctx, "the stats to show 3 pending", `document.querySelector('#inbox-stats tbody button[data-status="PENDING"]')?.textContent === "3"`)
	screenshot(t, ctx, "admin-after-replay.png")

	for _, m := range console() {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			t.Errorf("browser console: %s (%s:%d)", m, m.URL, m.Line)
		}
	}
}

// Read-only: the same page shows the data and hides every button that writes.
func TestAdminPageReadOnlyInChromium(t *testing.T) {
	t.Parallel()
	ctx, console := browser(t)
	f := admintest.New(t, 1)
	f.RelayAll(t) // nothing waits: oldest_pending is null
	srv := f.Server(t, admin.Config{})

	step(t, ctx, "load the page", chromedp.Navigate(srv.URL+"/"))
	waitFor(t, ctx, "the FAILED row", `document.body.dataset.ready === "1" && document.querySelectorAll('#rows tbody tr[data-status="FAILED"]').length === 1`)
	require.Equal(t, []string{"sms", "0", "—", "—", "0", "running Pause"}, step(t, ctx, "read the relay row", chromedp.Evaluate[[]string](
		`[...document.querySelectorAll('#relays tbody td')].map(td => td.textContent)`)), "an unset time shows as a dash")
	mode := step(t, ctx, "read the mode", chromedp.Evaluate[string](`document.getElementById("mode").textContent`))
	require.Equal(t, "read-only", mode)
	visible := step(t, ctx, "count visible write buttons", chromedp.Evaluate[int](
		`[...document.querySelectorAll('#replay-all, button.replay, button.skip, button.pause, button.resume')].filter(b => b.offsetParent !== null).length`))
	require.Zero(t, visible)
	require.Equal(t, 1, f.Count(t, "FAILED"))
	for _, m := range console() {
		if m.Type == chromedp.ConsoleError || m.IsException() {
			t.Errorf("browser console: %s", m)
		}
	}
}
