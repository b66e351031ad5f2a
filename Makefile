# egress-proxies-operator
#
#   make demo   local control plane + local libvirt host + the operator, ending with a Ready proxy
#   make demo-external  the same without VMs: External Proxies on loopback, discovery answering
#   make test   every test tier; installs and builds what it needs on a fresh machine
#
# Built tools and test binaries are cached under $(CACHE), keyed by version.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/egress-proxies-operator
CONTROLLER_GEN_VERSION ?= v0.23.0
CONTROLLER_GEN := $(CACHE)/bin/controller-gen-$(CONTROLLER_GEN_VERSION)
# staticcheck 2026.2.2; the newest honnef.co/go/tools release that builds with this Go.
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK := $(CACHE)/bin/staticcheck-$(STATICCHECK_VERSION)
# Every build tag a file of the module carries. vet and staticcheck run once, with all of
# them set: no file is built only without a tag (no "!tag" constraints), so that one run
# reads every file, where a run per tag read the untagged ones five times. The test tiers
# compile each tag's own set. TestLintTagsCoverEveryFile (hack/lib) keeps the list whole.
BUILD_TAGS := integration e2e deploy rssbench
comma := ,
empty :=
space := $(empty) $(empty)
LINT_TAGS := $(subst $(space),$(comma),$(BUILD_TAGS))
# The shell scripts shellcheck reads: everything under hack/ and .ci/ that runs in a shell.
SHELL_SCRIPTS = $(sort $(wildcard hack/*.sh hack/lib/*.sh .ci/*))
GO_TEST_FLAGS ?=
# Every build but the -race one uses the image's configuration (static, -trimpath): vet,
# staticcheck, make build, the test tiers and make image-tar then share one compile of the
# dependencies. A different CGO_ENABLED or -trimpath recompiles all of them (5 min cold).
GO_BUILD_ENV = CGO_ENABLED=0 GOFLAGS="$(strip $(GOFLAGS) -trimpath)"
# The project's version: the chart's version and appVersion (make chart-version).
VERSION := $(shell cat VERSION)
CHART := charts/egress-proxies-operator

.PHONY: all
all: build

##@ Build

.PHONY: build
build: ## Build the manager and gateway binaries into bin/manager and bin/gateway.
	$(GO_BUILD_ENV) go build -o bin/manager ./cmd/manager
	$(GO_BUILD_ENV) go build -o bin/gateway ./cmd/gateway

# The image config/manager/manager.yaml runs; override both for a registry of your own
# (kustomize edit set image, or edit the Deployment).
IMG ?= egress-proxies-operator:latest
CONTAINER_TOOL ?= docker

.PHONY: docker-build
docker-build: ## Build the operator image IMG (egress-proxies-operator:latest: /manager and /gateway) from the Dockerfile.
	$(CONTAINER_TOOL) build -t $(IMG) .

.PHONY: image-tar
image-tar: ## Build the operator image IMG (manager and gateway) as a tarball, without a daemon or a registry (bin/image/manager.tar).
	@# The same image as docker-build: hack/imagebuild reads the Dockerfile's final stage for
	@# the binaries' paths (one -bin per COPY, in order), the entrypoint and the user. Load
	@# it with ctr images import, podman load or docker load, or push it with crane push.
	mkdir -p bin/image
	$(GO_BUILD_ENV) go build -ldflags="-s -w" -o bin/image/manager ./cmd/manager
	$(GO_BUILD_ENV) go build -ldflags="-s -w" -o bin/image/gateway ./cmd/gateway
	$(GO_BUILD_ENV) go run ./hack/imagebuild -dockerfile Dockerfile -bin bin/image/manager -bin bin/image/gateway -tag $(IMG) -o bin/image/manager.tar
	@echo "bin/image/manager.tar ($(IMG))"

.PHONY: docker-push
docker-push: ## Push the manager image IMG.
	$(CONTAINER_TOOL) push $(IMG)

$(CONTROLLER_GEN):
	mkdir -p $(CACHE)/bin
	GOBIN=$(CACHE)/bin/tmp-cg go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(CACHE)/bin/tmp-cg/controller-gen $@ && rmdir $(CACHE)/bin/tmp-cg

$(STATICCHECK):
	mkdir -p $(CACHE)/bin
	GOBIN=$(CACHE)/bin/tmp-sc go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(CACHE)/bin/tmp-sc/staticcheck $@ && rmdir $(CACHE)/bin/tmp-sc

# The types live in api/; every +kubebuilder:rbac marker lives in internal/controller.
.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs and RBAC from the markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/...;./internal/controller/..." output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	@# The chart installs the same CRDs and the same manager rules.
	rm -f $(CHART)/crds/*.yaml && cp config/crd/bases/*.yaml $(CHART)/crds/
	cp config/rbac/role.yaml $(CHART)/files/role.yaml

.PHONY: chart-version
chart-version: ## Write VERSION into the chart's version and appVersion, and the clients' versions.
	sed -i -e 's/^version: .*/version: $(VERSION)/' -e 's/^appVersion: .*/appVersion: "$(VERSION)"/' $(CHART)/Chart.yaml
	sed -i 's/^const Version = .*/const Version = "$(VERSION)"/' pkg/client/version.go
	sed -i 's/^__version__ = .*/__version__ = "$(VERSION)"/' clients/scrapy/egress_proxies/__init__.py

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths="./api/..."

# What controller-gen writes; hand-written files beside them are not checked here.
GENERATED := config/crd/bases config/rbac/role.yaml api/v1alpha1/zz_generated.deepcopy.go $(CHART)/crds $(CHART)/files

.PHONY: verify-generated
verify-generated: manifests generate ## Fail when committed generated files are stale.
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
	  echo "generated files are stale; run 'make manifests generate' and commit:"; \
	  git status --porcelain -- $(GENERATED); git diff -- $(GENERATED) | head -50; exit 1; fi

.PHONY: envtest
envtest: ## Build kube-apiserver and etcd for envtest into the cache (once per version).
	hack/envtest-assets.sh >/dev/null

##@ Test

# make test runs the tiers in this order, one at a time, and three steps besides in the
# background at nice 19 (hack/background.sh), on the CPU the tiers leave idle: the guest
# image from the start, the one-node cluster's other Kubernetes binaries once
# kube-apiserver and kubectl are built, and the fuzz smoke once the unit tests have passed.
# test-e2e waits for the guest image and test-deploy for the binaries (a failed background
# build is reported, and the tier builds it itself); the fuzz smoke's result is collected
# at the end. A tier run on its own, or make test BACKGROUND=, does all of it in the
# foreground.
.PHONY: test
test: BACKGROUND := yes
test: test-background-start lint verify-generated test-background-cluster test-unit test-integration-crawl test-integration-kvm2 test-e2e test-deploy test-background-wait ## Run every test tier.

# $$PPID in a recipe is make itself: a background step stops when make ends without it.
.PHONY: test-background-start
test-background-start:
	@# Debian's packages first, so that the guest image's own install is not a second apt
	@# beside lint's.
	@hack/deps.sh
	$(if $(BACKGROUND),hack/background.sh start $$PPID guest-image hack/guest-image.sh)

.PHONY: test-background-cluster
test-background-cluster: envtest
	@# kubectl in the foreground: test-unit needs it next, and envtest-assets.sh builds
	@# under one lock.
	@hack/envtest-assets.sh kubectl >/dev/null
	$(if $(BACKGROUND),hack/background.sh start $$PPID cluster-binaries hack/envtest-assets.sh kube-controller-manager kube-scheduler kubelet kube-proxy)

.PHONY: test-background-wait
test-background-wait:
	$(if $(BACKGROUND),hack/background.sh wait fuzz-smoke)

# Each gate runs even when an earlier one failed, so one run lists every finding; lint
# fails if any did. Missing tools are built (staticcheck) or installed (shellcheck, by
# hack/deps.sh), never skipped.
.PHONY: lint
lint: $(STATICCHECK) ## gofmt, go mod tidy, go vet and staticcheck with every build tag set, shellcheck.
	@hack/deps.sh
	@failed=(); \
	gate() { local name=$$1; shift; echo "lint: $$name"; "$$@" || failed+=("$$name"); }; \
	gofmt_clean() { local out; out=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$out" ] || { echo "gofmt needed:"; echo "$$out"; return 1; }; }; \
	tidy_clean() { go mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy and commit"; return 1; }; }; \
	gate gofmt gofmt_clean; \
	gate "go mod tidy" tidy_clean; \
	gate "go vet -tags=$(LINT_TAGS)" env $(GO_BUILD_ENV) go vet -tags=$(LINT_TAGS) ./...; \
	gate "staticcheck -tags=$(LINT_TAGS)" env $(GO_BUILD_ENV) $(STATICCHECK) -tags=$(LINT_TAGS) ./...; \
	gate shellcheck shellcheck $(SHELL_SCRIPTS); \
	gate "helm lint" "$$(hack/helm.sh)" lint --strict $(CHART); \
	gate "promtool check rules" promtool check rules config/prometheus/rules.yaml; \
	if [ $${#failed[@]} -gt 0 ]; then echo "lint: failed: $${failed[*]}"; exit 1; fi; \
	echo "lint: all gates passed"

.PHONY: test-unit
test-unit: envtest ## Unit and envtest tiers, with -race.
	hack/deps.sh
	@# kubectl (its kustomize) and helm for the chart's test against config/default.
	EPO_REQUIRE_ENVTEST=1 KUBEBUILDER_ASSETS=$$(hack/envtest-assets.sh kube-apiserver etcd kubectl) HELM=$$(hack/helm.sh) \
	  go test -race -count=1 $(GO_TEST_FLAGS) ./...
	$(if $(BACKGROUND),hack/background.sh start $$PPID fuzz-smoke hack/fuzz-smoke.sh,hack/fuzz-smoke.sh)

.PHONY: test-integration-crawl
test-integration-crawl: envtest ## Real crawlers through the discovery API (Scrapy, Go's pkg/client) and through the gateway (curl, requests, Scrapy, net/http, chromium), over envtest and loopback proxies.
	@# Debian's Scrapy, pytest, setuptools, wheel, pip and venv, for Debian's python3 (another
	@# one may come first on PATH).
	hack/crawl-deps.sh
	@# clients/scrapy's wheel, built offline, installed into a fresh venv over Debian's Scrapy,
	@# and its tests run against the installed package (about 25 s, most of it the venv's pip).
	hack/scrapy-wheel.sh test
	EPO_REQUIRE_ENVTEST=1 KUBEBUILDER_ASSETS=$$(hack/envtest-assets.sh) \
	  $(GO_BUILD_ENV) go test -tags=integration -count=1 -timeout=10m -v $(GO_TEST_FLAGS) ./test/crawl/...

.PHONY: test-integration-kvm2
test-integration-kvm2: ## The kvm2 provider against a real libvirtd over a real sshd on this machine.
	hack/libvirt-host.sh up
	@# Only the tests named *_realHost (the unit tests run in test-unit); one package at a
	@# time, because the fault tests stop sshd and libvirtd under everyone on the host.
	source $(CACHE)/libvirt-host/env && $(GO_BUILD_ENV) go test -tags=integration -count=1 -timeout=30m -p 1 -run '_realHost$$' \
	  $(GO_TEST_FLAGS) ./internal/provider/kvm2/... ./test/integration/...

.PHONY: test-e2e
test-e2e: envtest build ## A real guest VM carrying traffic, driven through the manager.
	hack/libvirt-host.sh up
	$(if $(BACKGROUND),hack/background.sh wait --advisory guest-image)
	hack/guest-image.sh >/dev/null
	source $(CACHE)/libvirt-host/env && EPO_REQUIRE_ENVTEST=1 KUBEBUILDER_ASSETS=$$(hack/envtest-assets.sh) \
	  $(GO_BUILD_ENV) go test -tags=e2e -count=1 -timeout=60m -v $(GO_TEST_FLAGS) ./test/e2e/...

# The cluster goes down afterwards whatever the result, so nothing is left running for the
# next tier; its binaries, certificates and images stay cached. Hold the libvirt host's
# lock around it like the other tiers that use it.
.PHONY: test-deploy
test-deploy: ## The operator's image on a one-node cluster (hack/cluster.sh), installed by helm install, with a real guest and a real Prometheus.
	@# Debian's prometheus (a Prometheus of the tier's own) and helm, both cached after the
	@# first run: built before the cluster is up, so a failure stops the tier early.
	hack/deps.sh
	hack/helm.sh >/dev/null
	hack/libvirt-host.sh up
	hack/guest-image.sh >/dev/null
	$(if $(BACKGROUND),hack/background.sh wait --advisory cluster-binaries)
	hack/cluster.sh up
	source $(CACHE)/libvirt-host/env && source $(CACHE)/cluster/env && HELM=$$(hack/helm.sh) && export HELM && \
	  { $(GO_BUILD_ENV) go test -tags=deploy -count=1 -timeout=60m -v $(GO_TEST_FLAGS) ./test/deploy/... && rc=0 || rc=$$?; }; \
	  hack/cluster.sh down; exit $$rc

.PHONY: bench
bench: envtest ## Benchmarks (figures for the issues' closing notes).
	KUBEBUILDER_ASSETS=$$(hack/envtest-assets.sh) go test -run='^$$' -bench=. -benchmem ./...

##@ Run

# make demo EXTERNAL=1 is make demo-external.
.PHONY: demo
demo: ## Local control plane, local libvirt host and the operator, ending with a Ready proxy.
	hack/demo.sh $(if $(EXTERNAL),up-external,up)

.PHONY: demo-external
demo-external: ## No VMs: local control plane, three tinyproxies on loopback as External Proxies, the operator without providers; ends with discovery answering.
	hack/demo.sh up-external

.PHONY: demo-down
demo-down: ## Delete every Proxy in the demo (their VMs with them), then stop what make demo or make demo-external started.
	hack/demo.sh down

.PHONY: kubectl
kubectl: ## Build kubectl (the envtest kube-apiserver's version) into the cache and print its path.
	@echo "$$(hack/envtest-assets.sh kubectl)/kubectl"

KVM_SSH_KEY ?= $(HOME)/.ssh/proxy-operator_ed25519
KVM_KNOWN_HOSTS ?= $(HOME)/.ssh/kvm_known_hosts
NAMESPACE ?= egress-proxies-operator-system

.PHONY: kvm-ssh-secret
kvm-ssh-secret: ## Create or update the kvm-ssh Secret from KVM_SSH_KEY and KVM_KNOWN_HOSTS.
	@grep -q 'PRIVATE KEY' "$(KVM_SSH_KEY)" || { echo "$(KVM_SSH_KEY): no PRIVATE KEY in it (is it the .pub?); refusing"; exit 1; }
	@test -s "$(KVM_KNOWN_HOSTS)" || { echo "$(KVM_KNOWN_HOSTS): missing or empty"; exit 1; }
	kubectl -n $(NAMESPACE) create secret generic kvm-ssh \
	  --from-file=id_ed25519="$(KVM_SSH_KEY)" --from-file=known_hosts="$(KVM_KNOWN_HOSTS)" \
	  --dry-run=client -o yaml | kubectl apply -f -

DISCOVERY_TOKEN_FILE ?=

.PHONY: discovery-token-secret
discovery-token-secret: ## Create or update the discovery-token Secret: DISCOVERY_TOKEN_FILE's token, or a new random one.
	@if [ -n "$(DISCOVERY_TOKEN_FILE)" ]; then test -s "$(DISCOVERY_TOKEN_FILE)" || { echo "$(DISCOVERY_TOKEN_FILE): missing or empty"; exit 1; }; \
	  src="$(DISCOVERY_TOKEN_FILE)"; else src=$$(mktemp); trap 'rm -f "$$src"' EXIT; \
	  head -c 32 /dev/urandom | base64 | tr -d '/+=\n' >"$$src"; fi; \
	kubectl -n $(NAMESPACE) create secret generic discovery-token --from-file=token="$$src" \
	  --dry-run=client -o yaml | kubectl apply -f -; \
	echo "crawlers send it as Authorization: Bearer; read it with:"; \
	echo "  kubectl -n $(NAMESPACE) get secret discovery-token -o jsonpath='{.data.token}' | base64 -d"

.PHONY: deploy
deploy: ## Apply config/default to the current kubectl context.
	kubectl apply -k config/default

.PHONY: help
help:
	@awk 'BEGIN{FS=":.*##"} /^[a-zA-Z0-9_-]+:.*##/{printf "  %-24s %s\n",$$1,$$2}' $(MAKEFILE_LIST)
