// Package kubetest runs a real Kubernetes API server for tests: Debian's
// etcd and the kube-apiserver scripts/setup-kube builds, both on loopback
// ports of their own, with static token authentication and RBAC. No
// kubelet, scheduler or controllers run: a test creates pods (with the
// node name it wants) and writes their status itself, as a kubelet would.
package kubetest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// BinDir is where scripts/setup-kube puts kube-apiserver (RXLANE_CACHE/bin
// when RXLANE_CACHE is set).
const BinDir = "/var/cache/rxlane/bin"

// Users of the server's token file.
const (
	// Admin is in system:masters (the test's own client).
	Admin = "admin"
	// Agent has no rights beyond what RBAC objects the test creates
	// give it (the chart's ClusterRole, bound to it).
	Agent = "rxlane-agent"
)

// Cluster is a running API server.
type Cluster struct {
	URL    string
	dir    string
	tokens map[string]string
}

// Binaries finds etcd and kube-apiserver; the error names what is missing.
func Binaries() (etcd, apiserver string, err error) {
	bin := BinDir
	if c := os.Getenv("RXLANE_CACHE"); c != "" {
		bin = filepath.Join(c, "bin")
	}
	apiserver = filepath.Join(bin, "kube-apiserver")
	if _, err := os.Stat(apiserver); err != nil {
		if p, lerr := exec.LookPath("kube-apiserver"); lerr == nil {
			apiserver = p
		} else {
			return "", "", fmt.Errorf("no kube-apiserver in %s or $PATH: run scripts/setup-kube", bin)
		}
	}
	etcd, err = exec.LookPath("etcd")
	if err != nil {
		return "", "", errors.New("no etcd: run scripts/setup (Debian's etcd-server)")
	}
	return etcd, apiserver, nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// start runs a process with its output in dir/name.log, stopped (TERM,
// then KILL after 10 s) at the test's end. The channel closes when it
// has exited.
func start(t *testing.T, dir, name string, path string, args ...string) <-chan struct{} {
	t.Helper()
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	// No Pdeathsig: it fires when the forking OS thread exits, and a
	// namespace test's threads do (internal/netns never unlocks a thread
	// that entered a namespace): the server would die mid-test.
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("%s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return done
}

// Start runs etcd and kube-apiserver for the test and waits (at most
// 60 s) until the server is ready. Both stop when the test ends.
func Start(t *testing.T) *Cluster {
	t.Helper()
	etcd, apiserver, err := Binaries()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cp, pp, ap := freePort(t), freePort(t), freePort(t)
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", cp)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", pp)
	start(t, dir, "etcd", etcd, "--name", "kubetest", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "kubetest="+peerURL)

	c := &Cluster{URL: fmt.Sprintf("https://127.0.0.1:%d", ap), dir: dir, tokens: map[string]string{}}
	var tokens []byte
	for _, u := range []string{Admin, Agent} {
		b := make([]byte, 16)
		rand.Read(b)
		c.tokens[u] = hex.EncodeToString(b)
		group := ""
		if u == Admin {
			group = ",system:masters"
		}
		tokens = fmt.Appendf(tokens, "%s,%s,%s%s\n", c.tokens[u], u, u, group)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tokenFile := write("tokens.csv", tokens)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	saKey := write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	exited := start(t, dir, "kube-apiserver", apiserver,
		"--etcd-servers", clientURL, "--etcd-prefix", "/kubetest",
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(ap),
		// The kubernetes Service's endpoint may not be loopback: a
		// documentation address, and no reconciler writing it.
		"--advertise-address", "192.0.2.1", "--endpoint-reconciler-type", "none",
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", tokenFile, "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.96.0.0/24",
		// No controller manager makes service-account tokens.
		"--disable-admission-plugins", "ServiceAccount")
	t.Cleanup(func() {
		// Registered after the processes' stops: runs before them, while
		// the server still runs.
		if t.Failed() {
			t.Logf("kube-apiserver's log ends:\n%s", tail(filepath.Join(dir, "kube-apiserver.log"), 6000))
			t.Logf("etcd's log ends:\n%s", tail(filepath.Join(dir, "etcd.log"), 3000))
		}
	})
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, _ := http.NewRequest("GET", c.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+c.tokens[Admin])
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		gone := false
		select {
		case <-exited:
			gone = true
		default:
		}
		if gone || time.Now().After(deadline) {
			logs := tail(filepath.Join(dir, "kube-apiserver.log"), 4000)
			t.Fatalf("kube-apiserver not ready within 60 s or exited (exited: %v, last error: %v); its log ends:\n%s", gone, err, logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return c
}

// Kubeconfig writes a kubeconfig for user (Admin or Agent) and returns
// its path. The server's certificate is self-signed: the kubeconfig
// skips its verification (loopback only).
func (c *Cluster) Kubeconfig(t *testing.T, user string) string {
	t.Helper()
	p := filepath.Join(c.dir, user+".kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubetest
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: %s
  user:
    token: %s
contexts:
- name: kubetest
  context:
    cluster: kubetest
    user: %s
current-context: kubetest
`, c.URL, user, c.tokens[user], user)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Client is a clientset for user.
func (c *Cluster) Client(t *testing.T, user string) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig(t, user))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// tail is the last n bytes of a file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
