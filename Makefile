# isthmus — build, run and test.
#   make run    install the system packages it needs, then discover this host
#   make test   formatting, lints and the whole test suite (what CI runs)
#   make deploy-check   render and validate deploy/ and the Containerfile (kubectl kustomize, kubernetes-validate, checkov)
#   make kube-assets    build the Kubernetes v1.20.2 the tests start, from Debian's source package (tests/kubernetes/build.sh)
#   make slurm-roots    build the Slurm 22.05, 24.11 and 26.05 roots the tests run, from Debian bookworm's, trixie's and
#                       sid's packages by the Slurm image's recipe (tests/slurm/root.sh)
#   make cross-arm64   build the aarch64 isthmus (Debian's cross toolchain) and run the hardware and Slurm-renderer
#                      crates' unit tests for aarch64 under qemu-user-static (make test runs it in its suite)
#   make image  build the images isthmus and isthmus-slurm for linux/amd64 and linux/arm64 with docker, podman or
#               buildah (docs/deploy.md, "Images")
#   make sbom   the binary's SBOM (SPDX 2.3) from Cargo.lock with cargo-sbom: target/sbom/isthmus-<version>.spdx.json

CARGO ?= cargo
# arm64 (aarch64): Debian's cross toolchain, the :arm64 libraries isthmus links and the emulator that runs the result
# (.cargo/config.toml names the linker, the pkg-config directories and the runner for that target only).
ARM64_APT_PACKAGES := crossbuild-essential-arm64 libhwloc-dev:arm64 libudev-dev:arm64 qemu-user-static
AARCH64 := aarch64-unknown-linux-gnu
APT_PACKAGES := libhwloc-dev libudev-dev pkg-config hwloc slurmd slurmctld slurm-client munge bzip2 pci.ids python3 diffutils prometheus util-linux \
  golang-1.19-go etcd-server ibsim-utils libumad2sim0 infiniband-diags rsync busybox-static \
  golang-github-modern-go-reflect2-dev libc6-dev containerd runc containernetworking-plugins openssl iproute2 curl debootstrap \
  $(ARM64_APT_PACKAGES)
# The manifest checkers, from PyPI, in a project-local virtual environment: the Kubernetes schemas, checkov, and the
# Prometheus Operator's schemas (pydantic models generated from its CRDs, for tests/monitoring/operator_schema.py).
PY_TOOLS := kubernetes-validate==1.37.0 checkov==3.3.30 cloudcoil==0.6.0 cloudcoil-models-prometheus-operator==0.80.1.0
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)

.PHONY: build-arm64 sbom sbom-tool cross-arm64 deps deploy-tools deploy-check kube-assets slurm-roots build run test test-fast fmt lint bench image image-bases

deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  case "$$missing" in *:arm64*) \
	    dpkg --print-foreign-architectures | grep -qx arm64 || $$SUDO dpkg --add-architecture arm64;; \
	  esac; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	  case "$$missing" in *etcd-server*) \
	    if [ -d /run/systemd/system ]; then $$SUDO systemctl stop etcd || true; \
	    elif [ -x /etc/init.d/etcd ]; then $$SUDO /etc/init.d/etcd stop >/dev/null 2>&1 || true; fi;; \
	  esac; \
	fi
	@if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx $(AARCH64); then \
	  rustup target add $(AARCH64) || echo "rustup could not add $(AARCH64): the aarch64 build is not run"; \
	fi

# kubectl (for `kubectl kustomize`): the machine's, or Debian's kubernetes-client when there is none.
deploy-tools:
	@if ! kubectl kustomize --help >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends kubernetes-client; \
	fi
	@if [ "$$(cat $(VENV)/.py-tools 2>/dev/null)" != "$(PY_TOOLS)" ]; then \
	  [ -x $(VENV)/bin/pip ] || python3 -m venv $(VENV) || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get install -y -qq python3-venv && /usr/bin/python3 -m venv $(VENV); }; \
	  $(VENV)/bin/pip install --quiet --disable-pip-version-check $(PY_TOOLS) && echo "$(PY_TOOLS)" > $(VENV)/.py-tools; \
	fi

deploy-check: deploy-tools
	$(CARGO) test -p isthmus-tests --features system --test deploy_manifests --test deploy_scan --test deploy_runtime \
	  --test controller_deploy --test image

# Kubernetes v1.20.2 (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet) from Debian's own kubernetes
# source package with Debian's Go 1.19 (~4 min the first time, instant afterwards), so that the first Kubernetes test
# does not spend its time building it. With KUBEBUILDER_ASSETS set, the tests use that directory instead.
kube-assets: deps
	@if [ -z "$$KUBEBUILDER_ASSETS" ]; then bash tests/kubernetes/build.sh >/dev/null; fi

# The Slurm releases the end-to-end tests run beside the machine's 22.05: 24.11 (Debian trixie) and 26.05 (Debian sid)
# in debootstrap roots made by the Slurm image's recipe, and 22.05's own such root (bookworm) for the test that each
# line's image root registers and runs jobs; cached under ~/.cache/isthmus/slurm (~1.5 min each the first time,
# instant afterwards). The tests build a missing root themselves; building them here first keeps that time out of
# the tests'.
slurm-roots: deps
	bash tests/slurm/root.sh 22.05 >/dev/null
	bash tests/slurm/root.sh 24.11 >/dev/null
	bash tests/slurm/root.sh 26.05 >/dev/null

build: deps
	$(CARGO) build --release -p isthmus-cli --bin isthmus

# The aarch64 release binary (target/aarch64-unknown-linux-gnu/release/isthmus) with Debian's cross toolchain.
build-arm64: deps
	$(CARGO) build --release --target $(AARCH64) -p isthmus-cli --bin isthmus

# cargo-sbom from crates.io, pinned, installed once into .tools/ (~2 min to compile).
SBOM_TOOL_VERSION := 0.10.0
SBOM_TOOL := $(CURDIR)/.tools/bin/cargo-sbom
sbom-tool:
	@if [ "$$($(SBOM_TOOL) sbom --version 2>/dev/null)" != "cargo-sbom $(SBOM_TOOL_VERSION)" ]; then \
	  $(CARGO) install --quiet --locked --root $(CURDIR)/.tools cargo-sbom --version $(SBOM_TOOL_VERSION); \
	fi

# The binary's SBOM: every crate the isthmus-cli package resolves to (Cargo.lock), with version, licence and purl.
# One document serves the x86_64 and the aarch64 binary: cargo's resolution does not depend on the target (it lists
# every platform's dependencies). Copied to target/image/ for the images (/usr/share/doc/isthmus/).
sbom: sbom-tool
	@mkdir -p target/sbom target/image
	$(SBOM_TOOL) sbom --cargo-package isthmus-cli --output-format spdx_json_2_3 > target/sbom/isthmus-$(WORKSPACE_VERSION).spdx.json.tmp
	@mv target/sbom/isthmus-$(WORKSPACE_VERSION).spdx.json.tmp target/sbom/isthmus-$(WORKSPACE_VERSION).spdx.json
	@cp target/sbom/isthmus-$(WORKSPACE_VERSION).spdx.json target/image/isthmus.spdx.json
	@echo "target/sbom/isthmus-$(WORKSPACE_VERSION).spdx.json"

# The images' copy, made again when the lock file or the workspace's manifest changed.
target/image/isthmus.spdx.json: Cargo.lock Cargo.toml
	@$(MAKE) --no-print-directory sbom

run: build
	./target/release/isthmus discover

fmt:
	$(CARGO) fmt --all -- --check

# The hardware crate also without libhwloc (its `hwloc` feature off): what is dead or unused only there shows.
lint:
	$(CARGO) clippy --workspace --all-targets --features isthmus-tests/system -- -D warnings
	$(CARGO) clippy -p isthmus-topology --no-default-features --all-targets -- -D warnings

# The fast tier as a machine with only Rust, a C toolchain, pkg-config and libhwloc-dev has it: `cargo test` with
# nothing else on PATH (the system tier, `--features isthmus-tests/system`, is what `make test` adds).
test-fast:
	@d=$$(mktemp -d); for t in cargo rustc rustdoc rustup cc gcc ld ld.bfd as ar ranlib strip pkg-config; do \
	  p=$$(command -v $$t) && ln -s "$$p" "$$d/$$t"; done; \
	env -i HOME="$$HOME" PATH="$$d" CARGO_HOME="$${CARGO_HOME:-$$HOME/.cargo}" RUSTUP_HOME="$${RUSTUP_HOME:-$$HOME/.rustup}" \
	  cargo test --workspace --no-fail-fast; status=$$?; rm -rf "$$d"; exit $$status

# The aarch64 isthmus (target/aarch64-unknown-linux-gnu/debug/isthmus; tests/tests/arm64_qemu.rs compares its output
# under qemu with the x86_64 build's on the recorded arm64 tree and two hosts with GPUs) and the fast tier of the hardware and Slurm-renderer
# crates run for aarch64 under qemu-user-static (the runner in .cargo/config.toml). Only the binary and those two
# crates' unit tests are built for aarch64 (docs/benchmarks.md: the time it adds). The property tests draw 32 cases
# each under emulation (their 256 run natively in the suite): the emulated run shows the same code passes on aarch64.
# Without the Rust standard library for aarch64 (rustup could not fetch it) nothing is built and the suite's
# arm64_qemu test says NOT RUN with the reason. ISTHMUS_AARCH64_TARGET_DIR, when set, is the target directory of this
# build (make test builds it in one of its own, in a lane beside the other tests: scripts/test-suite.sh); arm64_qemu
# looks for the binary there.
cross-arm64: deps
	@if [ ! -d "$$(rustc --print target-libdir --target $(AARCH64))" ]; then \
	  echo "cross-arm64: no Rust standard library for $(AARCH64) (rustup target add $(AARCH64)): not built"; \
	else \
	  dir=$${ISTHMUS_AARCH64_TARGET_DIR:+--target-dir $$ISTHMUS_AARCH64_TARGET_DIR}; \
	  $(CARGO) build --target $(AARCH64) $$dir -p isthmus-cli --bin isthmus && \
	  PROPTEST_CASES=32 $(CARGO) test --target $(AARCH64) $$dir -p isthmus-topology -p isthmus-gres --lib; \
	fi

# The suite: scripts/test-suite.sh builds every test target once and runs the binaries in two lanes at once (the
# binaries that wait on Slurm sites of their own beside everything else), printing each binary's wall time at the end.
# Checks that could not run here (e.g. ones only a newer Kubernetes can show) are listed after the suite; so is
# every daemon the suite started and left running (scripts/leftovers.sh), which fails it. The suite runs make
# cross-arm64 itself, first in its slurm lane, in a target directory of its own (target/aarch64): the build uses the
# time the lanes' waits leave, where before the lanes it held up every test.
test: deps deploy-tools kube-assets slurm-roots sbom-tool fmt lint
	@rm -f target/not-run.txt
	@scripts/leftovers.sh snapshot target/daemons-before.txt
	@status=0; CARGO=$(CARGO) scripts/test-suite.sh --features isthmus-tests/system || status=$$?; \
	if [ -s target/not-run.txt ]; then echo "== not run in this environment:"; sort -u target/not-run.txt; fi; \
	scripts/leftovers.sh check target/daemons-before.txt || status=1; \
	exit $$status

bench: build
	./scripts/bench-discover.sh

# The images (Containerfile), for each platform of IMAGE_PLATFORMS (default linux/amd64 linux/arm64):
# $(IMAGE_REPO):$(IMAGE_TAG)-<arch> (target runtime) and $(IMAGE_REPO)-slurm:$(SLURM_IMAGE_TAG)-<arch> (runtime-slurm);
# the build machine's own architecture is also tagged without the suffix, the names deploy/ uses. Push the
# per-architecture tags and join them into one multi-architecture name with your registry's tool (`podman manifest
# create` / `docker buildx imagetools create`). The engine: $(CONTAINER_ENGINE), else the first of docker, podman,
# buildah that answers (scripts/container-engine.sh says which). IMAGE_BINARY=prebuilt puts the host's builds in
# instead of compiling in the image: target/release/isthmus for amd64 (`make build`) and
# target/aarch64-unknown-linux-gnu/release/isthmus for arm64 (`make build-arm64`); the host must be Debian bookworm.
# Either way the binary is cross-compiled, never compiled under emulation; an arm64 image built on x86_64 runs its
# `apt-get install` under qemu-user-static's binfmt handler, which the build machine must have registered.
# BASE_IMAGE and BUILDER_IMAGE replace the Containerfile's FROM images (`make image-bases` makes local
# ones where no registry can be reached), IMAGE_BUILD_FLAGS adds engine flags. SLURM_BASE_IMAGE is the Debian image
# of the Slurm image (default BASE_IMAGE: bookworm, Slurm 22.05; trixie 24.11, sid 26.05) and SLURM_IMAGE_TAG its tag.
# Every image is labelled (org.opencontainers.image.*) and carries the SBOM `make sbom` writes.
WORKSPACE_VERSION := $(shell sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
WORKSPACE_REPOSITORY := $(shell sed -n '/^\[workspace.package\]/,/^\[/s/^repository *= *"\(.*\)"/\1/p' Cargo.toml)
IMAGE_REPO ?= isthmus
IMAGE_TAG ?= $(WORKSPACE_VERSION)
IMAGE_BINARY ?= build
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
BASE_IMAGE ?=
BUILDER_IMAGE ?=
SLURM_BASE_IMAGE ?=
SLURM_IMAGE_TAG ?= $(IMAGE_TAG)
IMAGE_BUILD_FLAGS ?=

# docker: BuildKit (the default since docker 23, with buildx), which skips the stages a target does not need.
image: export DOCKER_BUILDKIT ?= 1
# Where the kernel lists the registered binfmt handlers (qemu-user-static's qemu-aarch64, qemu-x86_64).
BINFMT_DIR ?= /proc/sys/fs/binfmt_misc
image: target/image/isthmus.spdx.json
	@engine=$$(sh scripts/container-engine.sh) || exit 1; \
	host=$$(case "$$(uname -m)" in aarch64|arm64) echo arm64;; x86_64|amd64) echo amd64;; *) uname -m;; esac); \
	case "$(IMAGE_BINARY)" in \
	  build) suffix= ;; \
	  prebuilt) suffix=-prebuilt ;; \
	  *) echo "IMAGE_BINARY must be build or prebuilt, not $(IMAGE_BINARY)" >&2; exit 1 ;; \
	esac; \
	for platform in $(IMAGE_PLATFORMS); do \
	  arch=$${platform#linux/}; \
	  case "$$platform" in linux/amd64|linux/arm64) ;; \
	    *) echo "IMAGE_PLATFORMS: linux/amd64 and linux/arm64 are built, not $$platform" >&2; exit 1 ;; esac; \
	  qemu=qemu-$$( [ "$$arch" = arm64 ] && echo aarch64 || echo x86_64 ); \
	  if [ "$$arch" != "$$host" ] && [ ! -e "$(BINFMT_DIR)/$$qemu" ]; then \
	    echo "$$platform on $$host: the $$arch image's apt-get runs under emulation and $(BINFMT_DIR)/$$qemu is not registered (Debian: apt-get install qemu-user-static binfmt-support), or set IMAGE_PLATFORMS=linux/$$host" >&2; exit 1; \
	  fi; \
	  if [ "$(IMAGE_BINARY)" = prebuilt ]; then \
	    bin=$$( [ "$$arch" = arm64 ] && echo target/$(AARCH64)/release/isthmus || echo target/release/isthmus ); \
	    test -x "$$bin" || { echo "IMAGE_BINARY=prebuilt needs $$bin for $$platform: run make $$( [ "$$arch" = arm64 ] && echo build-arm64 || echo build ) first" >&2; exit 1; }; \
	    mkdir -p target/image/$$arch && cp "$$bin" target/image/$$arch/isthmus.tmp && mv target/image/$$arch/isthmus.tmp target/image/$$arch/isthmus; \
	  fi; \
	done; \
	case "$$engine" in *buildah) build="$$engine bud" ;; *) build="$$engine build" ;; esac; \
	args="$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE))"; \
	args="$$args $(if $(BUILDER_IMAGE),--build-arg BUILDER_IMAGE=$(BUILDER_IMAGE))"; \
	args="$$args $(if $(SLURM_BASE_IMAGE),--build-arg SLURM_BASE_IMAGE=$(SLURM_BASE_IMAGE))"; \
	args="$$args --build-arg ISTHMUS_VERSION=$(WORKSPACE_VERSION) --build-arg ISTHMUS_SOURCE=$(WORKSPACE_REPOSITORY)"; \
	commit=$$(git rev-parse --short=12 HEAD 2>/dev/null) && args="$$args --build-arg ISTHMUS_COMMIT=$$commit"; \
	created=$$(git log -1 --format=%cd --date=iso-strict 2>/dev/null) && args="$$args --build-arg ISTHMUS_CREATED=$$created"; \
	for platform in $(IMAGE_PLATFORMS); do \
	  arch=$${platform#linux/}; \
	  for t in runtime:$(IMAGE_REPO):$(IMAGE_TAG) runtime-slurm:$(IMAGE_REPO)-slurm:$(SLURM_IMAGE_TAG); do \
	    target=$${t%%:*}$$suffix; name=$${t#*:}; \
	    echo "$$build --platform $$platform --target $$target -t $$name-$$arch"; \
	    $$build -f Containerfile --platform $$platform --target $$target $$args $(IMAGE_BUILD_FLAGS) -t $$name-$$arch . || exit 1; \
	    if [ "$$arch" = "$$host" ]; then $$engine tag $$name-$$arch $$name || exit 1; fi; \
	  done; \
	  echo "built $(IMAGE_REPO):$(IMAGE_TAG)-$$arch and $(IMAGE_REPO)-slurm:$(SLURM_IMAGE_TAG)-$$arch ($$platform) with $$engine"; \
	done; \
	case " $(IMAGE_PLATFORMS) " in *" linux/$$host "*) \
	  echo "built $(IMAGE_REPO):$(IMAGE_TAG) and $(IMAGE_REPO)-slurm:$(SLURM_IMAGE_TAG) with $$engine";; esac

# Base and builder images made on this machine (debootstrap and the machine's Rust toolchain), for machines that
# cannot reach a container registry; prints the make image arguments that use them.
image-bases:
	@base=$$(bash scripts/local-base-images.sh base) && builder=$$(bash scripts/local-base-images.sh builder) && \
	echo "make image BASE_IMAGE=$$base BUILDER_IMAGE=$$builder"
