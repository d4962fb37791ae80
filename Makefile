# rxlane — see README.md. Targets that touch the kernel need root.
GO      ?= go
BIN     := bin/rxlane
CNI_BIN := bin/rxlane-cni
CNI_DIR ?= /opt/cni/bin
OUT     ?= out

.PHONY: all setup build generate check-generate manifest vet test demo demo-nodes bench clean kernel-test install

all: build

setup:
	scripts/setup

build:
	$(GO) build -o $(BIN) ./cmd/rxlane
	$(GO) build -o $(CNI_BIN) ./cmd/rxlane-cni

# Regenerate the BPF objects and their Go bindings (needs clang).
generate:
	$(GO) generate ./...

# CI: the committed BPF objects must match their sources.
check-generate: generate
	git diff --exit-code -- '*_bpfel.go' '*_bpfel.o' || { echo "generated BPF files are stale: run 'make generate' and commit"; exit 1; }

# Regenerate the plain Kubernetes manifest from the Helm chart (helm from
# scripts/setup-kube; a test in deploy/ checks the committed one is current).
manifest:
	scripts/gen-manifest

vet:
	@test -z "$$(gofmt -l cmd internal)" || { gofmt -l cmd internal; echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...

# Unit and namespace tests. Packages run one at a time (-p 1) so that
# namespace tests that send load do not disturb tracer tests.
test: vet check-generate
	$(GO) test -count=1 -p 1 -timeout 30m ./...

# The main job: build the testbed (layout nic: hostB's wire polled on the
# receive CPU by its NAPI kthread; application at nice -20), compare idle vs
# busy latency over the overlay and the host path, then vanilla vs priority
# lanes (and vanilla in the old arrangement), print the tables with the goal
# table, write the plots, tear down. Timing runs hold the machine's lock.
demo: setup build
	mkdir -p $(OUT)
	flock /tmp/rxlane-cpu.lock $(BIN) bench latency --prefix demo --json-out $(OUT)/latency.json --plot $(OUT)/latency-cdf.svg --plot $(OUT)/latency-cdf.png > $(OUT)/latency.txt
	cat $(OUT)/latency.txt
	flock /tmp/rxlane-cpu.lock $(BIN) bench compare --prefix demo --baseline-arrangement --json-out $(OUT)/compare.json --plot $(OUT)/compare-cdf.svg --plot $(OUT)/compare-cdf.png > $(OUT)/compare.txt
	cat $(OUT)/compare.txt

# The same comparison on Flannel-, Calico- and Docker-shaped nodes (each
# built fresh, wire arranged as layout nic; lanes-queue is not offered on
# Docker), tables in out/compare-NODE.txt.
demo-nodes: setup build
	mkdir -p $(OUT)
	for n in flannel calico docker; do \
		flock /tmp/rxlane-cpu.lock $(BIN) bench compare --node $$n --reps 3 --json-out $(OUT)/compare-$$n.json \
			--plot $(OUT)/compare-$$n.png > $(OUT)/compare-$$n.txt || exit 1; \
		cat $(OUT)/compare-$$n.txt; \
	done

bench: build
	flock /tmp/rxlane-cpu.lock $(GO) test -run '^$$' -bench . -benchtime 2s -cpu 1 ./internal/...
	mkdir -p $(OUT)
	flock /tmp/rxlane-cpu.lock $(BIN) bench latency --prefix bench --json-out $(OUT)/latency.json --plot $(OUT)/latency-cdf.svg

# The kernel series: build compiled-out and compiled-in kernels, boot each
# under QEMU and run the selftest (also part of `make test` through
# internal/kernel when the toolchain is installed).
kernel-test: build
	$(BIN) kernel test --variant off,on

# The node agent as a systemd service (docs/agent.md): the binary, the
# unit, and an example config unless one is there. DESTDIR stages it.
PREFIX ?= /usr/local
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/rxlane
	sed 's|/usr/local/bin/rxlane|$(PREFIX)/bin/rxlane|g' dist/rxlane-agent.service > rxlane-agent.service.tmp
	install -D -m 0644 rxlane-agent.service.tmp $(DESTDIR)/etc/systemd/system/rxlane-agent.service
	rm -f rxlane-agent.service.tmp
	install -D -m 0755 $(CNI_BIN) $(DESTDIR)$(CNI_DIR)/rxlane-cni
	test -e $(DESTDIR)/etc/rxlane/agent.yaml || install -D -m 0600 dist/agent.yaml $(DESTDIR)/etc/rxlane/agent.yaml
	if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "edit /etc/rxlane/agent.yaml, check it with 'rxlane agent --check-config /etc/rxlane/agent.yaml', then: systemctl enable --now rxlane-agent"

clean:
	rm -rf bin $(OUT)
