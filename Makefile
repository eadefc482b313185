# isthmus — build, run and test.
#   make run    install the system packages it needs, then discover this host
#   make test   formatting, lints and the whole test suite (what CI runs)
#   make deploy-check   render and validate deploy/daemonset (kubectl kustomize, kubernetes-validate, checkov)
#   make kube-assets    build the Kubernetes v1.20.2 the tests start, from Debian's source package (tests/kubernetes/build.sh)

CARGO ?= cargo
APT_PACKAGES := libhwloc-dev libudev-dev pkg-config hwloc slurmd slurmctld slurm-client munge bzip2 pci.ids python3 diffutils prometheus util-linux \
  golang-1.19-go etcd-server ibsim-utils libumad2sim0 infiniband-diags rsync busybox-static \
  golang-github-modern-go-reflect2-dev libc6-dev
# The manifest checkers, from PyPI, in a project-local virtual environment.
PY_TOOLS := kubernetes-validate==1.37.0 checkov==3.3.30
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)

.PHONY: deps deploy-tools deploy-check kube-assets build run test fmt lint bench

deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	  case "$$missing" in *etcd-server*) \
	    if [ -d /run/systemd/system ]; then $$SUDO systemctl stop etcd || true; \
	    elif [ -x /etc/init.d/etcd ]; then $$SUDO /etc/init.d/etcd stop >/dev/null 2>&1 || true; fi;; \
	  esac; \
	fi

# kubectl (for `kubectl kustomize`): the machine's, or Debian's kubernetes-client when there is none.
deploy-tools:
	@if ! kubectl kustomize --help >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends kubernetes-client; \
	fi
	@if [ ! -x $(VENV)/bin/checkov ] || [ ! -x $(VENV)/bin/kubernetes-validate ]; then \
	  python3 -m venv $(VENV) || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get install -y -qq python3-venv && /usr/bin/python3 -m venv $(VENV); }; \
	  $(VENV)/bin/pip install --quiet --disable-pip-version-check $(PY_TOOLS); \
	fi

deploy-check: deploy-tools
	$(CARGO) test -p isthmus-tests --features system --test deploy_manifests --test deploy_scan --test deploy_runtime --test controller_deploy

# Kubernetes v1.20.2 (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet) from Debian's own kubernetes
# source package with Debian's Go 1.19 (~4 min the first time, instant afterwards), so that the first Kubernetes test
# does not spend its time building it. With KUBEBUILDER_ASSETS set, the tests use that directory instead.
kube-assets: deps
	@if [ -z "$$KUBEBUILDER_ASSETS" ]; then bash tests/kubernetes/build.sh >/dev/null; fi

build: deps
	$(CARGO) build --release -p isthmus-agent --bin isthmus

run: build
	./target/release/isthmus discover

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets --features isthmus-tests/system -- -D warnings

# Checks that could not run here (e.g. ones only a newer Kubernetes can show) are listed after the suite.
test: deps deploy-tools kube-assets fmt lint
	@rm -f target/not-run.txt
	@status=0; $(CARGO) test --workspace --no-fail-fast --features isthmus-tests/system || status=$$?; \
	if [ -s target/not-run.txt ]; then echo "== not run in this environment:"; sort -u target/not-run.txt; fi; \
	exit $$status

bench: build
	./scripts/bench-discover.sh
