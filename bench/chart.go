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
	height := marginTop + 40
	for _, g := range groups {
		height += len(g.bars)*(barHeight+barGap) + groupGap
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
	if maxV == 0 {
		maxV = 1
	}
	plotW := chartWidth - labelWidth - 90
	scale := float64(plotW) / maxV
	// Grid lines at round values.
	step := niceStep(maxV / 5)
	for v := step; v <= maxV; v += step {
		gx := labelWidth + int(v*scale)
		fill(img, gx, marginTop, 1, height-marginTop-30, light)
		text(img, gx-12, height-12, grey, short(v))
	}
	y := marginTop
	for _, g := range groups {
		text(img, 10, y+barHeight-3, black, g.variant)
		title := variantTitles[g.variant]
		if len(title) > 26 {
			title = title[:25] + "."
		}
		text(img, 10, y+barHeight+10, grey, title)
		for _, b := range g.bars {
			w := max(int(b.value*scale), 1)
			fill(img, labelWidth, y, w, barHeight, brokerColors[b.broker])
			text(img, labelWidth+w+4, y+barHeight-3, black, fmt.Sprintf("%.0f", b.value))
			y += barHeight + barGap
		}
		y += groupGap
		if len(g.bars) == 1 {
			y += 10 // room for the description line
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img.SubImage(image.Rect(0, 0, chartWidth, max(y+30, height))).(*image.RGBA)); err != nil {
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
