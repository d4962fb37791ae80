package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain doubles as the socket client of TestSocketRefusesNonRoot: run
// with $RXLANE_AGENT_TEST_CLIENT (a socket path) it asks for the status
// and prints the answer (or the error) as JSON.
func TestMain(m *testing.M) {
	if path := os.Getenv("RXLANE_AGENT_TEST_CLIENT"); path != "" {
		c, err := Dial(path)
		if err != nil {
			fmt.Printf(`{"dial_error":%q}`, err.Error())
			os.Exit(0)
		}
		var st Status
		err = c.Call(Request{Op: OpStatus}, &st)
		var re *RemoteError
		if errors.As(err, &re) {
			json.NewEncoder(os.Stdout).Encode(map[string]string{"code": re.Code, "error": re.Msg})
		} else {
			json.NewEncoder(os.Stdout).Encode(map[string]any{"error": fmt.Sprint(err), "status": st})
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testAgent is an agent with an empty configuration whose socket serves
// at path (no kernel state: status only).
func testAgent(t *testing.T, path string) *server {
	t.Helper()
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil)), cfg: &Config{Socket: path}, lanes: map[uint64]*laneRun{}, steers: map[uint64]*steerRun{}}
	srv, err := listen(path, a)
	if err != nil {
		t.Fatal(err)
	}
	go srv.serve()
	t.Cleanup(srv.close)
	return srv
}

// TestSocketModesAndStaleFile: the socket is 0600 in a 0700 directory; a
// stale socket file (its agent killed) reads as "no agent" and does not
// block a new agent; a socket an agent answers is not taken over.
func TestSocketModesAndStaleFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: the socket serves uid 0 only")
	}
	path := filepath.Join(t.TempDir(), "run", "agent.sock")
	// A stale socket: bound, then its process gone (no unlink).
	os.MkdirAll(filepath.Dir(path), 0o700)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(path); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("dial of a stale socket: %v, want ErrNoAgent", err)
	}
	// A new agent replaces the stale file.
	testAgent(t, path)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := c.Call(Request{Op: OpStatus}, &st); err != nil {
		t.Fatal(err)
	}
	err = c.Call(Request{Op: "explode"}, nil)
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeInvalid || !strings.Contains(re.Msg, `unknown op "explode"`) {
		t.Errorf("unknown op: %v", err)
	}
	err = c.Call(Request{Op: OpLanesAdd, NetnsID: "netns-1", Netns: "elsewhere", Rule: &RuleSpec{Dst: "10.0.0.1"}}, nil)
	if !errors.As(err, &re) || re.Code != CodeUnmanaged {
		t.Errorf("add to an unmanaged namespace: %v", err)
	}
	c.Close()
	// A live agent's socket is not taken over.
	if _, err := listen(path, nil); !errors.Is(err, ErrAgentRunning) {
		t.Errorf("listen over a live socket: %v, want ErrAgentRunning", err)
	}

	dir := filepath.Join(t.TempDir(), "new")
	testAgent(t, filepath.Join(dir, "agent.sock"))
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket dir: %v %v, want 0700", fi.Mode().Perm(), err)
	}
}

// TestSocketRefusesNonRoot connects from a child process running as
// nobody: the agent checks the peer's credentials (SO_PEERCRED) and
// answers "denied" without serving the request. The socket's modes are
// opened up for it, as a mistake or an attacker might: the credential
// check is the second line.
func TestSocketRefusesNonRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to run a child as nobody")
	}
	dir, err := os.MkdirTemp("", "rxlane-agent-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "agent.sock")
	testAgent(t, path)
	// A copy of the test binary nobody may run, and a socket nobody may
	// reach.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	for p, m := range map[string]os.FileMode{dir: 0o755, path: 0o666} {
		if err := os.Chmod(p, m); err != nil {
			t.Fatal(err)
		}
	}
	client := func(uid uint32) map[string]any {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), "RXLANE_AGENT_TEST_CLIENT="+path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("client as uid %d: %v\n%s", uid, err, out)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("client output %q: %v", out, err)
		}
		return got
	}
	got := client(65534)
	if got["code"] != CodeDenied || !strings.Contains(fmt.Sprint(got["error"]), "uid 0 only (peer uid 65534") {
		t.Fatalf("nobody's request: %v, want denied", got)
	}
	got = client(0)
	if got["error"] != "<nil>" || got["status"] == nil {
		t.Fatalf("root's request: %v, want a status", got)
	}
}

// TestNotify reads sd_notify's datagrams on a real unixgram socket, as
// systemd's $NOTIFY_SOCKET (a path, and an abstract name).
func TestNotify(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := Notify("READY=1"); err != nil {
		t.Fatalf("without NOTIFY_SOCKET: %v", err)
	}
	for _, name := range []string{filepath.Join(t.TempDir(), "notify"), "@rxlane-test-notify-" + fmt.Sprint(os.Getpid())} {
		addr := name
		if name[0] == '@' {
			addr = "\x00" + name[1:]
		}
		ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		t.Setenv("NOTIFY_SOCKET", name)
		buf := make([]byte, 64)
		for _, state := range []string{"READY=1", "STOPPING=1"} {
			if err := Notify(state); err != nil {
				t.Fatal(err)
			}
			ln.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := ln.Read(buf)
			if err != nil || string(buf[:n]) != state {
				t.Fatalf("%s: read %q, %v; want %q", name, buf[:n], err, state)
			}
		}
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "nobody-listens"))
	if err := Notify("READY=1"); err == nil {
		t.Error("notify to a missing socket: no error")
	}
}
