package isolate

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// CPUSet is a sorted set of CPU numbers without duplicates.
type CPUSet []int

// NewCPUSet returns the set of the given CPUs.
func NewCPUSet(cpus ...int) CPUSet {
	m := map[int]bool{}
	var s CPUSet
	for _, c := range cpus {
		if !m[c] {
			m[c] = true
			s = append(s, c)
		}
	}
	sort.Ints(s)
	return s
}

// ParseCPUList parses the kernel's list format ("0-3,8,10-11"); an empty
// string is the empty set.
func ParseCPUList(s string) (CPUSet, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("cpu list %q: bad cpu %q", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return NewCPUSet(out...), nil
}

// ParseMask parses the kernel's hex bitmap format ("ff", "00000000,0000000f").
func ParseMask(s string) (CPUSet, error) {
	s = strings.TrimSpace(s)
	hex := strings.ReplaceAll(s, ",", "")
	var out []int
	for i := len(hex) - 1; i >= 0; i-- {
		v, err := strconv.ParseUint(hex[i:i+1], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("cpu mask %q: bad hex digit %q", s, hex[i:i+1])
		}
		base := (len(hex) - 1 - i) * 4
		for b := 0; b < 4; b++ {
			if v&(1<<b) != 0 {
				out = append(out, base+b)
			}
		}
	}
	return NewCPUSet(out...), nil
}

// List formats the set in the kernel's list format.
func (s CPUSet) List() string {
	var parts []string
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(s[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", s[i], s[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// Mask formats the set as a hex bitmap in 32-bit groups separated by
// commas, as the kernel prints and accepts it ("0" for the empty set).
func (s CPUSet) Mask() string {
	if len(s) == 0 {
		return "0"
	}
	words := make([]uint32, s[len(s)-1]/32+1)
	for _, c := range s {
		words[c/32] |= 1 << (c % 32)
	}
	var b strings.Builder
	for i := len(words) - 1; i >= 0; i-- {
		if i == len(words)-1 {
			fmt.Fprintf(&b, "%x", words[i])
		} else {
			fmt.Fprintf(&b, ",%08x", words[i])
		}
	}
	return b.String()
}

// Contains reports whether c is in the set.
func (s CPUSet) Contains(c int) bool {
	i := sort.SearchInts(s, c)
	return i < len(s) && s[i] == c
}

// Minus returns s without the CPUs of o.
func (s CPUSet) Minus(o CPUSet) CPUSet {
	var out CPUSet
	for _, c := range s {
		if !o.Contains(c) {
			out = append(out, c)
		}
	}
	return out
}

// Equal reports whether both sets hold the same CPUs.
func (s CPUSet) Equal(o CPUSet) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}
