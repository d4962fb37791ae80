package bench

import (
	"encoding/json"
	"math"
	"sort"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Summary describes a latency distribution in microseconds.
type Summary struct {
	Count int64   `json:"count"`
	Avg   float64 `json:"avg_us"`
	P50   float64 `json:"p50_us"`
	P90   float64 `json:"p90_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p99_9_us"`
	Max   float64 `json:"max_us"`
}

// Summarize builds an HDR histogram (1 ns .. 100 s, 3 significant digits)
// of round-trip times in ns and reads its statistics.
func Summarize(ns []int64) Summary {
	h := hdrhistogram.New(1, 100e9, 3)
	for _, v := range ns {
		h.RecordValue(max(v, 1))
	}
	us := func(v int64) float64 { return float64(v) / 1e3 }
	return Summary{
		Count: h.TotalCount(),
		Avg:   h.Mean() / 1e3,
		P50:   us(h.ValueAtQuantile(50)),
		P90:   us(h.ValueAtQuantile(90)),
		P99:   us(h.ValueAtQuantile(99)),
		P999:  us(h.ValueAtQuantile(99.9)),
		Max:   us(h.Max()),
	}
}

// Spread is the median and range of one statistic over repetitions.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// MarshalJSON writes a statistic that has no samples (NaN) as null, which
// encoding/json cannot do for a float.
func (s Spread) MarshalJSON() ([]byte, error) {
	f := func(v float64) *float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		Median *float64 `json:"median"`
		Min    *float64 `json:"min"`
		Max    *float64 `json:"max"`
	}{f(s.Median), f(s.Min), f(s.Max)})
}

// SpreadOf is the median and range of vs (NaNs when empty).
func SpreadOf(vs []float64) Spread {
	if len(vs) == 0 {
		return Spread{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Spread{Median: m, Min: s[0], Max: s[len(s)-1]}
}
