// Package adminbrowser_test drives ops/admin's page in headless Chromium (chromedp) against
// rows the real components made (internal/admintest's fixture, which ops/admin's own tests use
// too): black-box tests of the admin handler, in the e2e module so that the library's go.mod
// does not require chromedp.
package adminbrowser_test

import (
	"testing"

	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestMain skips the examples, which need PostgreSQL, under -short (see pgtest.Main).
func TestMain(m *testing.M) { pgtest.Main(m) }
