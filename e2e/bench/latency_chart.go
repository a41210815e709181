package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
)

// latencyChart draws the end-to-end latency variants as horizontal bars on a log scale, one
// row per broker and rate, p50 solid and p99 pale behind it, with the targets as
// marks. It returns nil when the report has no latency result.
func latencyChart(rep *Report) ([]byte, error) {
	type row struct {
		label    string
		broker   string
		p50, p99 float64
	}
	var rows []row
	maxV := 1.0
	for _, v := range latencyVariants {
		for _, r := range rep.Results {
			if r.Variant != v || r.Error != "" || r.P50ms == nil || r.P99ms == nil {
				continue
			}
			rows = append(rows, row{label: fmt.Sprintf("%s %s", r.Broker, v), broker: r.Broker, p50: *r.P50ms, p99: *r.P99ms})
			maxV = max(maxV, *r.P99ms)
		}
	}
	if len(rows) == 0 {
		return nil, nil
	}
	const (
		left, rowH, top = 170, 24, 64
		plotW           = chartWidth - left - 150
	)
	height := top + len(rows)*rowH + 40
	img := image.NewRGBA(image.Rect(0, 0, chartWidth, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	black := color.RGBA{0x20, 0x20, 0x20, 0xff}
	grey := color.RGBA{0x99, 0x99, 0x99, 0xff}
	light := color.RGBA{0xe6, 0xe6, 0xe6, 0xff}
	red := color.RGBA{0xcc, 0x33, 0x33, 0xff}
	m := rep.Machine
	text(img, 10, 18, black, "end-to-end latency, producer COMMIT -> relay -> broker -> consumer commit, ms, log scale (lower is better)")
	text(img, 10, 34, grey, fmt.Sprintf("%s  %d CPUs %s  dark: p50, pale: p99; red marks: targets p50 10 ms / p99 25 ms at 50/s, p50 25 ms / p99 100 ms at 1000/s", m.Date, m.CPUs, m.Model))
	// Log axis from 1 ms to the next power of ten above the slowest p99.
	decades := math.Ceil(math.Log10(maxV))
	x := func(ms float64) int {
		return left + int(math.Log10(max(ms, 1))/decades*float64(plotW))
	}
	for d := 0.0; d <= decades; d++ {
		gx := x(math.Pow(10, d))
		fill(img, gx, top-6, 1, len(rows)*rowH+6, light)
		text(img, gx-8, height-14, grey, short(math.Pow(10, d)))
	}
	y := top
	for _, r := range rows {
		c := brokerColors[r.broker]
		pale := color.RGBA{uint8(0xff - (0xff-int(c.R))/3), uint8(0xff - (0xff-int(c.G))/3), uint8(0xff - (0xff-int(c.B))/3), 0xff}
		text(img, 10, y+15, black, r.label)
		fill(img, left, y+2, max(x(r.p99)-left, 1), rowH-6, pale)
		fill(img, left, y+2, max(x(r.p50)-left, 1), rowH-6, c)
		text(img, x(r.p99)+6, y+15, black, fmt.Sprintf("p50 %.1f  p99 %.1f", r.p50, r.p99))
		targets := []float64{10, 25}
		if r.label[len(r.label)-4:] == "1000" {
			targets = []float64{25, 100}
		}
		for _, t := range targets {
			fill(img, x(t), y, 2, rowH-2, red)
		}
		y += rowH
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
