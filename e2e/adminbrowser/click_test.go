package adminbrowser_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// click clicks the element selector matches, once it is there, visible and enabled. The page
// redraws its tables after every action and on its refresh timer, so looking a node up and
// clicking it must happen in one turn of the page's event loop: chromedp.Click resolves a node
// id first and clicks later, and a redraw in between fails with "Could not find node with given
// id" (seen in CI on the relay's Pause button).
func click(t *testing.T, ctx context.Context, what, selector string) {
	t.Helper()
	js := fmt.Sprintf(`(() => {
		const el = document.querySelector(%q);
		if (!el || el.disabled || el.getClientRects().length === 0) return false;
		el.click();
		return true;
	})()`, selector)
	step(t, ctx, what, chromedp.Poll[bool](js, chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(8*time.Second)))
}
