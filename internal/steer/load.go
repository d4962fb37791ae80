package steer

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// UserHZ is the unit of /proc/stat's columns (USER_HZ, 100 on Linux).
const UserHZ = 100

// ParseStat returns each CPU's idle time (idle + iowait columns) from the
// text of /proc/stat, by CPU number.
func ParseStat(b []byte) (map[int]time.Duration, error) {
	idle, _, err := parseCPUTimes(b)
	return idle, err
}

// parseCPUTimes returns each CPU's idle time (idle + iowait columns) and
// task time (user + nice + system) from the text of /proc/stat, by CPU
// number. Task time is sampled at the tick, which runs whenever a task
// does, so it is accurate where idle time (tickless) needs the wall
// clock.
func parseCPUTimes(b []byte) (idle, task map[int]time.Duration, err error) {
	idle, task = map[int]time.Duration{}, map[int]time.Duration{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		cpu, err := strconv.Atoi(f[0][3:])
		if err != nil {
			return nil, nil, fmt.Errorf("parse /proc/stat line %q: %w", f[0], err)
		}
		var col [6]uint64 // user, nice, system, idle, iowait (may be absent)
		for i := 1; i < len(col) && i < len(f); i++ {
			if col[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
				return nil, nil, fmt.Errorf("parse /proc/stat %s column %d: %w", f[0], i, err)
			}
		}
		tick := time.Second / UserHZ
		task[cpu] = time.Duration(col[1]+col[2]+col[3]) * tick
		idle[cpu] = time.Duration(col[4]+col[5]) * tick
	}
	if len(idle) == 0 {
		return nil, nil, fmt.Errorf("parse /proc/stat: no per-CPU lines")
	}
	return idle, task, sc.Err()
}

// Sampler measures per-CPU load as 1 - delta idle / delta wall-clock.
//
// The usual formula (1 - idle / sum of all columns) is wrong by 20-30
// points on a tickless kernel without IRQ time accounting: softirq work run
// from the idle loop lands in no column at all, so the sum of columns
// undercounts elapsed time. Wall-clock time does not.
type Sampler struct {
	// Path is the stat file ("/proc/stat" when empty).
	Path string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Alpha is the weight of the newest sample in the smoothed load
	// (exponential moving average); 0 or 1 means no smoothing.
	Alpha float64

	last     map[int]time.Duration
	lastT    time.Time
	smoothed map[int]float64
}

func (s *Sampler) read() (map[int]time.Duration, time.Time, error) {
	p := s.Path
	if p == "" {
		p = "/proc/stat"
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	b, err := os.ReadFile(p)
	t := now()
	if err != nil {
		return nil, t, fmt.Errorf("read cpu load: %w", err)
	}
	idle, err := ParseStat(b)
	return idle, t, err
}

// Sample reads the stat file and returns the smoothed load (0..1) of every
// CPU since the previous call; the first call only sets the baseline and
// returns nil.
func (s *Sampler) Sample() (map[int]float64, error) {
	idle, t, err := s.read()
	if err != nil {
		return nil, err
	}
	prev, prevT := s.last, s.lastT
	s.last, s.lastT = idle, t
	if prev == nil {
		return nil, nil
	}
	wall := t.Sub(prevT)
	if wall <= 0 {
		return nil, fmt.Errorf("sample cpu load: clock did not advance")
	}
	if s.smoothed == nil {
		s.smoothed = map[int]float64{}
	}
	out := map[int]float64{}
	for cpu, v := range idle {
		p, ok := prev[cpu]
		if !ok {
			continue
		}
		l := 1 - float64(v-p)/float64(wall)
		l = min(max(l, 0), 1)
		if old, ok := s.smoothed[cpu]; ok && s.Alpha > 0 && s.Alpha < 1 {
			l = s.Alpha*l + (1-s.Alpha)*old
		}
		s.smoothed[cpu] = l
		out[cpu] = l
	}
	return out, nil
}

// Average is the mean load of the CPUs in set (Algorithm 1's L_avg over
// the FALCON CPU set); CPUs without a sample count as idle.
func Average(loads map[int]float64, set []int) float64 {
	if len(set) == 0 {
		return 0
	}
	var sum float64
	for _, c := range set {
		sum += loads[c]
	}
	return sum / float64(len(set))
}

// Switch is the global on/off of steering with hysteresis: it turns off
// when the average load reaches Threshold and back on only when it falls
// below Threshold - Hysteresis, so a load hovering at the threshold does
// not flip the stages' CPUs (each flip risks reordering) every window.
type Switch struct {
	Threshold, Hysteresis float64
	off                   bool
	// Flips counts on/off transitions.
	Flips int
}

// Update feeds one average load and returns whether steering is on.
func (s *Switch) Update(avg float64) bool {
	was := s.off
	if s.off {
		s.off = avg >= s.Threshold-s.Hysteresis
	} else {
		s.off = avg >= s.Threshold
	}
	if was != s.off {
		s.Flips++
	}
	return !s.off
}

// On reports the current state.
func (s *Switch) On() bool { return !s.off }
