package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"slices"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// The chart is drawn with the standard library and x/image's built-in bitmap font, so that
// writing it needs no system fonts and no plotting dependency.

var brokerColors = map[string]color.RGBA{
	"sql":      {0x33, 0x66, 0xcc, 0xff},
	"kafka":    {0xdd, 0x88, 0x22, 0xff},
	"amqp":     {0x33, 0x99, 0x55, 0xff},
	"postgres": {0x88, 0x55, 0xaa, 0xff},
}

// chartLabels are the variants' short descriptions under their ids.
var chartLabels = map[string]string{
	B0:        "bare handler (ceiling)",
	B1:        "own tx, no dedupe",
	B2:        "B1 + in-memory Deduplicator",
	B3:        "effectively-once, per message",
	B4:        "effectively-once, group commit (default)",
	B5Ingest:  "inbox ingest",
	B5Process: "inbox processing, leases",
	B6:        "watermill-sql subscriber tx",
	B7:        "effectively-once, batch handler",
	B7Process: "inbox processing, batch handler",
	Relay:     "outbox Relay, strict order",
	RelayLane: "outbox Relay, publish lanes",
	Forwarder: "Watermill forwarder",
	C1Single:  "raw claims, 1 row/statement",
	C1Batch:   "raw claims, 100 rows/statement",
}

const (
	chartWidth = 1100
	labelWidth = 250
	barHeight  = 15
	barGap     = 3
	groupGap   = 12
	marginTop  = 64
)

// chart draws msgs/s as horizontal bars, one group per variant, one bar per broker.
func chart(rep *Report) ([]byte, error) {
	type bar struct {
		broker string
		value  float64
	}
	type group struct {
		variant string
		bars    []bar
	}
	var groups []group
	maxV := 0.0
	var brokers []string
	for _, v := range allVariants {
		if slices.Contains(latencyVariants, v) || slices.Contains(idleVariants, v) {
			continue // not throughput
		}
		g := group{variant: v}
		for _, r := range rep.Results {
			if r.Variant == v && r.Error == "" && r.MsgsPerSec > 0 {
				g.bars = append(g.bars, bar{r.Broker, r.MsgsPerSec})
				maxV = max(maxV, r.MsgsPerSec)
				if !slices.Contains(brokers, r.Broker) {
					brokers = append(brokers, r.Broker)
				}
			}
		}
		if len(g.bars) > 0 {
			groups = append(groups, g)
		}
	}
	height := marginTop + 40 // room for the axis labels
	for _, g := range groups {
		height += len(g.bars)*(barHeight+barGap) + groupGap
		if len(g.bars) == 1 {
			height += 10 // room for the description line
		}
	}
	img := image.NewRGBA(image.Rect(0, 0, chartWidth, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	black := color.RGBA{0x20, 0x20, 0x20, 0xff}
	grey := color.RGBA{0x99, 0x99, 0x99, 0xff}
	light := color.RGBA{0xe6, 0xe6, 0xe6, 0xff}

	m := rep.Machine
	text(img, 10, 18, black, "watermill-once throughput, msgs/s (higher is better); latencies and notes in latest.md")
	text(img, 10, 34, grey, fmt.Sprintf("%s  %d CPUs %s  PostgreSQL %s  %s  load %s -> %s", m.Date, m.CPUs, m.Model, firstWord(m.PostgreSQL), m.GoVersion, m.LoadAvgStart, m.LoadAvgEnd))
	x := 10
	for _, b := range brokers {
		fill(img, x, 42, 12, 12, brokerColors[b])
		text(img, x+16, 53, black, b)
		x += 30 + 8*len(b)
	}
	// The ceilings (B0, C1) can be ten times anything else: the axis stops at the largest of
	// the other bars, and longer bars are cut at the edge, marked, and labelled.
	axisV := 0.0
	for _, g := range groups {
		if g.variant == B0 || g.variant == C1Single || g.variant == C1Batch {
			continue
		}
		for _, b := range g.bars {
			axisV = max(axisV, b.value)
		}
	}
	if axisV > 0 {
		maxV = min(maxV, axisV*1.15)
	}
	if maxV == 0 {
		maxV = 1
	}
	plotW := chartWidth - labelWidth - 130
	scale := float64(plotW) / maxV
	// Grid lines at round values.
	step := niceStep(maxV / 5)
	for v := step; v <= maxV; v += step {
		gx := labelWidth + int(v*scale)
		fill(img, gx, marginTop, 1, height-marginTop-34, light)
		text(img, gx-12, height-14, grey, short(v))
	}
	y := marginTop
	for _, g := range groups {
		text(img, 10, y+barHeight-3, black, g.variant)
		text(img, 10, y+barHeight+10, grey, chartLabels[g.variant])
		for _, b := range g.bars {
			w := max(int(b.value*scale), 1)
			label := fmt.Sprintf("%.0f", b.value)
			if w > plotW {
				w = plotW
				label += " (cut)"
			}
			fill(img, labelWidth, y, w, barHeight, brokerColors[b.broker])
			if label != fmt.Sprintf("%.0f", b.value) {
				for i := 0; i < 3; i++ { // a white break mark near the end of a cut bar
					fill(img, labelWidth+w-14+i*4, y, 2, barHeight, color.RGBA{0xff, 0xff, 0xff, 0xff})
				}
			}
			text(img, labelWidth+w+4, y+barHeight-3, black, label)
			y += barHeight + barGap
		}
		y += groupGap
		if len(g.bars) == 1 {
			y += 10 // room for the description line
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func fill(img *image.RGBA, x, y, w, h int, c color.RGBA) {
	draw.Draw(img, image.Rect(x, y, x+w, y+h), image.NewUniform(c), image.Point{}, draw.Src)
}

func text(img *image.RGBA, x, y int, c color.RGBA, s string) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func niceStep(v float64) float64 {
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if p*m >= v {
			return p * m
		}
	}
	return p * 10
}

func short(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%gk", v/1000)
	}
	return fmt.Sprintf("%g", v)
}

func firstWord(s string) string {
	for i, r := range s {
		if r == ' ' {
			return s[:i]
		}
	}
	return s
}
