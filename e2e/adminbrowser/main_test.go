package adminbrowser_test

import (
	"testing"

	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TestMain skips the examples, which need PostgreSQL, under -short (see pgtest.Main).
func TestMain(m *testing.M) { pgtest.Main(m) }
