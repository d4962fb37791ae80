package kernel

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// TAPTest is one "ok"/"not ok" line of a TAP stream.
type TAPTest struct {
	Num    int    `json:"num"`
	OK     bool   `json:"ok"`
	Skip   bool   `json:"skip,omitempty"`
	Todo   bool   `json:"todo,omitempty"` // "not ok ... # TODO reason": a known failure, not counted as one
	Desc   string `json:"desc"`
	Reason string `json:"reason,omitempty"` // text after '#': skip reason or failure detail
}

// TAPResult is what the guest's selftest reported.
type TAPResult struct {
	Tests    []TAPTest `json:"tests"`
	Plan     int       `json:"plan"`              // from "1..N"; 0 if absent
	Bailout  string    `json:"bailout,omitempty"` // "Bail out!" reason
	ExitCode int       `json:"exit_code"`         // from "rxlane-selftest-exit=N"; -1 if absent
	Diag     []string  `json:"diagnostics,omitempty"`
	// KernelChecked: the guest grepped its kernel log for the checkers'
	// reports after the suite ("rxlane-kernel-reports=N" seen);
	// KernelReports are the lines it found (KASAN, lockdep, DEBUG_LIST,
	// RCU, WARN_ON, oops). Any report fails the run.
	KernelChecked bool     `json:"kernel_checked"`
	KernelReports []string `json:"kernel_reports,omitempty"`
}

var (
	tapLine  = regexp.MustCompile(`^(not )?ok (\d+)(?: -)? ?([^#]*?)\s*(?:#\s*(.*))?$`)
	planLine = regexp.MustCompile(`^1\.\.(\d+)`)
	exitLine = regexp.MustCompile(`rxlane-selftest-exit=(\d+)`)
)

const (
	reportPrefix = "rxlane-kernel-report: "
	reportsCount = "rxlane-kernel-reports="
)

// ParseTAP reads a guest console log and extracts the selftest's TAP
// output. Kernel messages and other console noise are ignored.
func ParseTAP(r io.Reader) (TAPResult, error) {
	res := TAPResult{ExitCode: -1}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		switch {
		case tapLine.MatchString(line):
			m := tapLine.FindStringSubmatch(line)
			num, _ := strconv.Atoi(m[2])
			t := TAPTest{Num: num, OK: m[1] == "", Desc: strings.TrimSpace(m[3]), Reason: strings.TrimSpace(m[4])}
			switch r := strings.ToUpper(t.Reason); {
			case strings.HasPrefix(r, "SKIP"):
				t.Skip = true
				t.Reason = strings.TrimSpace(t.Reason[4:])
			case strings.HasPrefix(r, "TODO"):
				t.Todo = true
				t.Reason = strings.TrimSpace(t.Reason[4:])
			}
			res.Tests = append(res.Tests, t)
		case planLine.MatchString(line):
			res.Plan, _ = strconv.Atoi(planLine.FindStringSubmatch(line)[1])
		case strings.HasPrefix(line, "Bail out!"):
			res.Bailout = strings.TrimSpace(strings.TrimPrefix(line, "Bail out!"))
		case strings.HasPrefix(line, reportPrefix):
			res.KernelReports = append(res.KernelReports, strings.TrimPrefix(line, reportPrefix))
		case strings.HasPrefix(line, reportsCount):
			res.KernelChecked = true
		case exitLine.MatchString(line):
			res.ExitCode, _ = strconv.Atoi(exitLine.FindStringSubmatch(line)[1])
		case strings.HasPrefix(line, "# "):
			res.Diag = append(res.Diag, strings.TrimPrefix(line, "# "))
		}
	}
	return res, sc.Err()
}

// Failed lists the failing tests (known failures marked TODO excluded).
func (r TAPResult) Failed() []TAPTest {
	var out []TAPTest
	for _, t := range r.Tests {
		if !t.OK && !t.Todo {
			out = append(out, t)
		}
	}
	return out
}

// Err says why the run does not count as a pass, or nil.
func (r TAPResult) Err() error {
	switch {
	case r.Bailout != "":
		return fmt.Errorf("selftest bailed out: %s", r.Bailout)
	case len(r.Tests) == 0:
		return fmt.Errorf("selftest printed no TAP results (guest crashed or timed out?)")
	case r.Plan == 0:
		return fmt.Errorf("selftest stopped after %d tests without a plan line (guest crashed or timed out?)", len(r.Tests))
	case r.Plan != len(r.Tests):
		return fmt.Errorf("selftest planned %d tests but reported %d", r.Plan, len(r.Tests))
	}
	if f := r.Failed(); len(f) > 0 {
		names := make([]string, len(f))
		for i, t := range f {
			names[i] = fmt.Sprintf("%d (%s)", t.Num, t.Desc)
		}
		return fmt.Errorf("%d of %d selftests failed: %s", len(f), len(r.Tests), strings.Join(names, ", "))
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("selftest exit status %d", r.ExitCode)
	}
	return r.KernelErr()
}

// KernelErr says whether the guest's kernel log was checked and clean.
func (r TAPResult) KernelErr() error {
	switch {
	case len(r.KernelReports) > 0:
		first := r.KernelReports
		if len(first) > 5 {
			first = first[:5]
		}
		return fmt.Errorf("the guest kernel logged %d checker report line(s) (KASAN, lockdep, list, RCU, WARN or oops): %s", len(r.KernelReports), strings.Join(first, " | "))
	case !r.KernelChecked:
		return fmt.Errorf("the guest did not report its kernel log check (rxlane-kernel-reports= missing: old initramfs?)")
	}
	return nil
}

// Counts returns passed, failed and skipped test counts; a known failure
// (TODO) counts as skipped.
func (r TAPResult) Counts() (pass, fail, skip int) {
	for _, t := range r.Tests {
		switch {
		case t.Todo:
			skip++
		case !t.OK:
			fail++
		case t.Skip:
			skip++
		default:
			pass++
		}
	}
	return
}
