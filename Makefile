# stampguard: `make help` lists the targets.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

BIN          := $(CURDIR)/bin
GO           ?= go
GOLANGCI_VER ?= v2.15.0
HELM_VER     ?= v3.22.0
CTRLGEN_VER  ?= v0.23.0
# chDB's engine (ClickHouse 26.7 as a library) from the npm registry, for
# the cross-engine tests (test/chdbtest).
CHDB_PKG     := @chdb/lib-linux-x64-gnu
CHDB_VER     := 26.7.3-stable.1
CHDB_LIB     := $(BIN)/chdb-26.7.3/libchdb.so

export KUBEBUILDER_ASSETS := $(BIN)
export PATH := $(BIN):$(PATH)
export CHDB_LIB_PATH := $(CHDB_LIB)

.PHONY: help
help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_\/-]+:.*## /{printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

## --- what the tests need -------------------------------------------------

$(BIN)/kube-apiserver $(BIN)/etcd &: test/tools/go.mod test/tools/go.sum
	@mkdir -p $(BIN)
	cd test/tools && $(GO) build -o $(BIN)/kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
	cd test/tools && $(GO) build -o $(BIN)/etcd go.etcd.io/etcd/server/v3
	@touch $(BIN)/kube-apiserver $(BIN)/etcd

.PHONY: controlplane
controlplane: $(BIN)/kube-apiserver $(BIN)/etcd ## build kube-apiserver and etcd into bin/ (reused when present)

# npm pack downloads the package (178 MB) into a temporary directory; only
# libchdb.so (566 MB) is kept, renamed into place once complete.
$(CHDB_LIB):
	@command -v npm >/dev/null || { echo "make chdb needs npm (the npm registry serves chDB's engine)"; exit 1; }
	@mkdir -p $(dir $@)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  echo "npm pack $(CHDB_PKG)@$(CHDB_VER)" && \
	  (cd "$$tmp" && npm pack --silent $(CHDB_PKG)@$(CHDB_VER) >/dev/null) && \
	  tar -xzf "$$tmp"/*.tgz -C "$$tmp" package/libchdb.so && \
	  cp "$$tmp"/package/libchdb.so $@.part && mv $@.part $@

.PHONY: chdb
chdb: $(CHDB_LIB) ## fetch ClickHouse 26.7 as a library (chDB, from npm) into bin/ (reused when present)

# apt-install installs the Debian packages named in $(1) when the check
# $(2) fails: one apt-get for all that a target needs.
define apt-install
	@$(2) || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; }
endef
HAVE_CLICKHOUSE := command -v clickhouse-server >/dev/null && command -v clickhouse-client >/dev/null
HAVE_ZOOKEEPER  := ls /usr/share/java/zookeeper-3*.jar >/dev/null 2>&1 && command -v java >/dev/null
HAVE_PROMETHEUS := command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v prometheus-alertmanager >/dev/null

.PHONY: clickhouse
clickhouse: ## install Debian's clickhouse-server when it is missing
	$(call apt-install,clickhouse-server clickhouse-client,$(HAVE_CLICKHOUSE))

.PHONY: zookeeper
zookeeper: ## install Debian's zookeeper (for the ClickHouse cluster tests) when it is missing
	$(call apt-install,zookeeper,$(HAVE_ZOOKEEPER))

.PHONY: prometheus
prometheus: ## install Debian's prometheus (with promtool) and prometheus-alertmanager when they are missing (the alert tests and the demo run them)
	$(call apt-install,prometheus prometheus-alertmanager,$(HAVE_PROMETHEUS))

.PHONY: debs
debs: ## clickhouse, zookeeper and prometheus in one apt-get
	$(call apt-install,clickhouse-server clickhouse-client zookeeper prometheus prometheus-alertmanager,$(HAVE_CLICKHOUSE) && $(HAVE_ZOOKEEPER) && $(HAVE_PROMETHEUS))

# The downloads (apt, npm) wait on the network while the compilers use
# the cores, so the test prerequisites are made side by side.
.PHONY: test-deps
test-deps: ## everything make test needs, made side by side
	@$(MAKE) --no-print-directory -j4 controlplane chdb helm debs $(BIN)/controller-gen

$(BIN)/controller-gen:
	GOBIN=$(BIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CTRLGEN_VER)

$(BIN)/golangci-lint:
	GOBIN=$(BIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VER)

$(BIN)/helm:
	GOBIN=$(BIN) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VER)

.PHONY: helm
helm: $(BIN)/helm ## install helm into bin/ (reused when present); test/chart runs it

## --- build, generate, check ---------------------------------------------

.PHONY: build
build: ## build the webhook and auditsink binaries into bin/
	$(GO) build -o $(BIN)/ ./cmd/...

IMAGES_DIR ?= $(BIN)/images
.PHONY: images
images: ## OCI image archives of webhook and auditsink in bin/images, without Docker (static, non-root, CA certificates; tagged as the chart's defaults)
	$(GO) run ./internal/ociimage/mkimage -out $(IMAGES_DIR) -revision "$$(git rev-parse HEAD 2>/dev/null)"

.PHONY: generate
generate: $(BIN)/controller-gen ## regenerate deepcopy code, the CRD manifest, the chart's webhook configurations, and the Grafana dashboards and alert rules
	$(BIN)/controller-gen object paths=./policy/api/...
	$(BIN)/controller-gen crd:crdVersions=v1 paths=./policy/api/... output:crd:artifacts:config=charts/stampguard/crds
	$(GO) generate ./dashboards ./policy/webhookconfig

.PHONY: verify-generate
verify-generate: generate ## fail when generated files are stale
	git diff --exit-code -- policy/api charts/stampguard/crds charts/stampguard/templates/webhook/_configurations.tpl dashboards/generated

.PHONY: lint
lint: $(BIN)/golangci-lint ## go vet, gofmt and golangci-lint
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(BIN)/golangci-lint run ./...

## --- demo ----------------------------------------------------------------

.PHONY: demo
DEMO_FLAGS ?=
demo: helm prometheus ## the whole story on loopback: apiserver + webhook + audit sink + ClickHouse, a minute of contending writers, the report (Ctrl-C ends it; DEMO_FLAGS="--exit --duration 20s")
	@echo "==> compiling the demo program into .demo/bin (the first time takes a few minutes; Go caches it)"
	@$(GO) build -o .demo/bin/demo ./test/demo
	@.demo/bin/demo $(DEMO_FLAGS)

## --- tests ----------------------------------------------------------------

# The longest test packages, named first so that they start first: go test
# runs packages in the order given, two at a time on two cores, and one of
# these started last would run alone at the end (e2e takes 11 to 14
# minutes, analytics/report 9).
SLOW_TESTS := ./test/e2e ./analytics/report ./dashboards ./internal/ociimage

.PHONY: test
test: test-deps verify-generate ## unit and end-to-end tests against a real apiserver, ClickHouse 18.16 and 26.7 (the CI command)
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 45m $(SLOW_TESTS) ./...

.PHONY: test-unit
test-unit: ## tests that need nothing installed: no apiserver, ClickHouse, helm or Prometheus (go test -short)
	$(GO) test -race -count=1 -short ./...

.PHONY: bench
bench: controlplane clickhouse zookeeper ## benchmarks (see BENCHMARKS.md)
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./... | tee bench.out

FUZZTIME ?= 60s
.PHONY: fuzz
fuzz: ## run each fuzz target for FUZZTIME (default 60s)
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s $$pkg || exit 1; \
	  done; \
	done
