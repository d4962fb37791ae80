package testbed_test

import (
	"errors"
	"os"
	"testing"

	"github.com/rxlane/rxlane/internal/testbed"
	"github.com/rxlane/rxlane/internal/testbed/testbedtest"
)

func TestDoSysfsShowsNodeDevices(t *testing.T) {
	c := testbedtest.Up(t, testbedtest.Config(t))
	err := testbed.DoSysfs(c, testbed.HostB, func() error {
		if _, err := os.Stat("/sys/class/net/" + testbed.WireB + "/queues/rx-0/rps_cpus"); err != nil {
			return err
		}
		if _, err := os.Stat("/sys/class/net/" + testbed.WireA); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("hostB's sysfs shows hostA's %s (err %v)", testbed.WireA, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("DoSysfs: %v", err)
	}
	if err := testbed.DoSysfsNamed(c.Prefix+"-nosuch", func() error { return nil }); !errors.Is(err, testbed.ErrNotUp) {
		t.Errorf("DoSysfsNamed on a missing netns: %v, want ErrNotUp", err)
	}
}
