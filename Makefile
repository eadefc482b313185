# isthmus — build, run and test.
#   make run    install the system packages it needs, then discover this host
#   make test   formatting, lints and the whole test suite (what CI runs)

CARGO ?= cargo
APT_PACKAGES := libhwloc-dev libudev-dev pkg-config hwloc slurmd slurmctld slurm-client munge bzip2 pci.ids python3 diffutils prometheus

.PHONY: deps build run test fmt lint bench

deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build: deps
	$(CARGO) build --release -p isthmus-agent --bin isthmus

run: build
	./target/release/isthmus discover

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: deps fmt lint
	$(CARGO) test --workspace --no-fail-fast

bench: build
	./scripts/bench-discover.sh
