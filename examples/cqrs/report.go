package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/pgtx"
)

// summary is what a run observed, for the printout and the test.
type summary struct {
	Broker   string `json:"broker"`
	Bookings int    `json:"bookings"` // bookings the front desk took

	// Rows of this run per table: each must equal Bookings.
	Requests    int `json:"requests"`
	BookingRows int `json:"booking_rows"`
	BeerOrders  int `json:"beer_orders"`
	// The hotel's report, and what it must say.
	ReportBookings int64 `json:"report_bookings"`
	Revenue        int64 `json:"revenue"`
	WantRevenue    int64 `json:"want_revenue"`
	Beers          int64 `json:"beers"`
	WantBeers      int64 `json:"want_beers"`
	// Messages of this run stored in the outbox, by name (cqrs.StructName), the undecodable one
	// and the parked ones aside: each must equal Bookings, one per booking whatever the copies.
	Outbox map[string]int `json:"outbox"`
	// Parked copies of the undecodable command: at least one (each copy delivered is parked,
	// as it was never applied).
	Parked int `json:"parked"`

	// Per consumer (handler): Fresh counts messages applied, Duplicates copies absorbed.
	Consumers map[string]once.Counters `json:"consumers"`
	Elapsed   time.Duration            `json:"elapsed_ns"`
}

// report counts the run's effects into s, prints them, and returns an error unless every effect
// is there exactly once.
func (e *env) report(ctx context.Context, s *summary, bookings []BookRoom, brokenID string, w io.Writer) error {
	for _, b := range bookings {
		s.WantRevenue += b.Price
		s.WantBeers += beersFor(b.Price)
	}
	count := func(table string) (n int, err error) {
		err = e.db.QueryRowContext(ctx, `SELECT count(*) FROM `+table+` WHERE hotel = $1`, e.runID).Scan(&n)
		return n, err
	}
	var err error
	if s.Requests, err = count(e.tables.requests); err != nil {
		return err
	}
	if s.BookingRows, err = count(e.tables.bookings); err != nil {
		return err
	}
	if s.BeerOrders, err = count(e.tables.beerOrders); err != nil {
		return err
	}
	if err := e.db.QueryRowContext(ctx, `SELECT coalesce(sum(bookings), 0), coalesce(sum(revenue), 0), coalesce(sum(beers), 0) FROM `+e.tables.reports+` WHERE hotel = $1`,
		e.runID).Scan(&s.ReportBookings, &s.Revenue, &s.Beers); err != nil {
		return err
	}
	s.Outbox = map[string]int{}
	if err := pgtx.QueryEach(ctx, e.db, func(row pgtx.Scanner) error {
		var name string
		var n int
		if err := row.Scan(&name, &n); err != nil {
			return err
		}
		s.Outbox[name] = n
		return nil
	}, `SELECT payload->'metadata'->>'name', count(*) FROM `+e.writer.Table()+`
		WHERE payload->>'destination_topic' LIKE $1 AND payload->>'destination_topic' <> $2 AND uuid <> $3 GROUP BY 1`,
		e.runID+".%", e.topic(poisonTopic), brokenID); err != nil {
		return err
	}
	s.Parked = e.parked(ctx, brokenID)

	fmt.Fprintf(w, "broker %s, hotel %s: %d bookings taken by the front desk, every message relayed twice, done in %s\n", s.Broker, e.runID, s.Bookings, s.Elapsed.Round(time.Millisecond))
	for _, consumer := range []string{bookRoomHandler, orderBeerOnRoomBooked, orderBeerHandler, financialReport} {
		c := s.Consumers[consumer]
		fmt.Fprintf(w, "%-22s %3d messages applied, %3d copies absorbed, %d failed attempts\n", consumer+":", c.Fresh, c.Duplicates, c.Failed)
	}
	fmt.Fprintf(w, "rows:      %d requests, %d bookings, %d beer orders\n", s.Requests, s.BookingRows, s.BeerOrders)
	fmt.Fprintf(w, "report:    %d bookings, revenue %d (want %d), %d beers (want %d)\n", s.ReportBookings, s.Revenue, s.WantRevenue, s.Beers, s.WantBeers)
	fmt.Fprintf(w, "outbox:    %v\n", s.Outbox)
	fmt.Fprintf(w, "parked:    the undecodable BookRoom %s, %d time(s) on %s\n", brokenID, s.Parked, e.topic(poisonTopic))
	var wrong []string
	for what, n := range map[string]int64{
		"requests": int64(s.Requests), "bookings": int64(s.BookingRows), "beer orders": int64(s.BeerOrders),
		"report bookings": s.ReportBookings, "BookRoom commands": int64(s.Outbox["BookRoom"]), "RoomBooked events": int64(s.Outbox["RoomBooked"]),
		"OrderBeer commands": int64(s.Outbox["OrderBeer"]), "BeerOrdered events": int64(s.Outbox["BeerOrdered"]),
	} {
		if n != int64(s.Bookings) {
			wrong = append(wrong, fmt.Sprintf("%s: %d", what, n))
		}
	}
	if s.Revenue != s.WantRevenue || s.Beers != s.WantBeers {
		wrong = append(wrong, fmt.Sprintf("report: revenue %d (want %d), beers %d (want %d)", s.Revenue, s.WantRevenue, s.Beers, s.WantBeers))
	}
	if s.Parked == 0 {
		wrong = append(wrong, "the undecodable command was not parked")
	}
	if len(wrong) > 0 {
		return fmt.Errorf("not every effect exactly once (want %d of each): %v", s.Bookings, wrong)
	}
	return nil
}

// printJSON ends a run from the command line with one JSON line of what it counted.
func (s summary) printJSON(w io.Writer) error { return json.NewEncoder(w).Encode(s) }
