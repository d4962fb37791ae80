package agent

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestDockerConfig parses the docker section: its defaults, its fields,
// and each mistake as one problem at the field's line.
func TestDockerConfig(t *testing.T) {
	cfg, err := ParseConfig("agent.yaml", []byte(`
lanes:
  - netns: /proc/self/ns/net
    workloads: true
docker:
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Docker == nil || cfg.Docker.Socket != "/var/run/docker.sock" || cfg.Docker.Networks != nil || cfg.Docker.Resync != time.Minute || cfg.Docker.Line != 5 {
		t.Fatalf("docker: alone: %+v", cfg.Docker)
	}
	cfg, err = ParseConfig("agent.yaml", []byte(`
lanes:
  - netns: /proc/self/ns/net
    workloads: true
docker:
  socket: /run/engine/docker.sock
  networks: [web, 4f3a2b1c0d9e]
`))
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Docker; d.Socket != "/run/engine/docker.sock" || !slices.Equal(d.Networks, []string{"web", "4f3a2b1c0d9e"}) {
		t.Fatalf("docker: %+v", d)
	}
	for _, tc := range []struct {
		v    string
		want time.Duration
	}{{"0", 0}, {"0s", 0}, {"0m", 0}, {"30s", 30 * time.Second}, {"1s", time.Second}} {
		cfg, err := ParseConfig("agent.yaml", []byte("lanes:\n  - netns: /proc/self/ns/net\n    workloads: true\ndocker:\n  resync: "+tc.v+"\n"))
		if err != nil || cfg.Docker.Resync != tc.want {
			t.Fatalf("resync %s: %+v, %v; want %v", tc.v, cfg.Docker, err, tc.want)
		}
	}
	if cfg, err := ParseConfig("agent.yaml", []byte("lanes:\n  - netns: /proc/self/ns/net\n")); err != nil || cfg.Docker != nil {
		t.Fatalf("no docker section: %+v, %v", cfg, err)
	}

	for _, tc := range []struct{ name, yaml, want string }{
		{"no lane takes workloads", `
lanes:
  - netns: /proc/self/ns/net
docker:
  socket: /var/run/docker.sock
`, `agent.yaml:4: docker: no lanes entry takes workloads: add workloads: true to the lane of the namespace where the overlay's VXLAN device is (for Docker's overlay, the network's sandbox)`},
		{"relative socket", `
lanes:
  - netns: /proc/self/ns/net
    workloads: true
docker:
  socket: docker.sock
`, `agent.yaml:6: docker.socket: "docker.sock": want an absolute path`},
		{"unknown field", `
lanes:
  - netns: /proc/self/ns/net
    workloads: true
docker:
  sock: /var/run/docker.sock
`, `agent.yaml:6: docker.sock: unknown field (known: socket, networks, resync)`},
		{"networks not a list", `
lanes:
  - netns: /proc/self/ns/net
    workloads: true
docker:
  networks: web
`, `agent.yaml:6: docker.networks: want a list, got "web"`},
		{"empty network", `
lanes:
  - netns: /proc/self/ns/net
    workloads: true
docker:
  networks:
    - web
    - ""
`, `agent.yaml:8: docker.networks[1]: empty network name`},
		{"resync too fast", `
lanes:
  - netns: /proc/self/ns/net
    workloads: true
docker:
  resync: 500ms
`, `agent.yaml:6: docker.resync: 500ms: want 1s or more (each resync lists the engine's containers), or 0 for none besides the reconnections'`},
		{"resync not a duration", `
lanes:
  - netns: /proc/self/ns/net
    workloads: true
docker:
  resync: often
`, `agent.yaml:6: docker.resync: "often": want a positive duration such as 500ms or 5s`},
		{"empty networks", `
lanes:
  - netns: /proc/self/ns/net
    workloads: true
docker:
  networks: []
`, `agent.yaml:6: docker.networks: empty list: leave it out for every overlay network`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig("agent.yaml", []byte(tc.yaml))
			var ce *ConfigError
			if !errors.As(err, &ce) || len(ce.Problems) != 1 {
				t.Fatalf("want one problem, got %v", err)
			}
			if got := ce.Error(); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}
