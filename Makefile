# rlscale: the two set-up commands are `make run` and `make test`; each installs what
# it needs first (a venv in .venv, caches under ~/.cache), so both work on a fresh clone.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
RLSCALE := $(VENV)/bin/rlscale
export PIP_CACHE_DIR ?= $(HOME)/.cache/pip
export TORCH_EXTENSIONS_DIR ?= $(HOME)/.cache/rlscale/torch_extensions
export RLSCALE_CACHE ?= $(HOME)/.cache/rlscale
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# Inductor's precompiled headers off for every process (rollout/engine.py says why).
export TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS ?= 0
# This repo's own modules keep their bytecode too (hack/setup-venv.sh says what it saves).
unexport PYTHONDONTWRITEBYTECODE
PYTEST_ARGS ?=

.PHONY: run test disk unit venv k8s prometheus cluster cluster-down lint crd bench gpu-check clean

## make venv GPU=1: the CUDA 13.0 torch and vLLM wheels from PyPI instead of vLLM's CPU build, for a machine
## with an NVIDIA GPU and an R580+ driver (docs/gpu.md, "One GPU"); GPU=auto: GPU=1 when nvidia-smi lists a GPU.
## Without GPU the CPU build, which `make test` needs. Never run on a GPU by this repository's CI.
GPU ?=
venv:
	@GPU=$(GPU) bash hack/setup-venv.sh

## make k8s: the real node's Debian packages (containerd, runc, CNI plugins, nftables...),
## then the control plane and node binaries built from Go modules.
k8s:
	@bash hack/cluster/node-deps.sh
	@bash hack/cluster/build.sh
	@bash hack/cluster/build-node.sh

prometheus:
	@bash hack/setup-prometheus.sh

## make images: the operator, trainer and rollout images (CPU variant) built here from a pinned
## Debian base, no registry (docs/operations.md, "Images"); hack/images/load.sh SOCKET imports
## them into a node's containerd. VARIANT=gpu builds the GPU variants (docs/gpu.md, "Images").
## make push REGISTRY=host[:port]/path [VARIANT=gpu] [TAG=...]: builds, then pushes that variant's
## images under the names the chart's defaults use (TAG: the chart's appVersion), e.g.
## `make images VARIANT=gpu REGISTRY=registry.example.com/ml/rlscale push`; PUSH_TLS_VERIFY=false
## for a plain-http registry (hack/images/push.sh).
VARIANT ?= $(or $(RLSCALE_IMAGES_VARIANT),cpu)
REGISTRY ?=
TAG ?=
PUSH_TLS_VERIFY ?= true
.PHONY: images push push-check
images:
	@bash hack/images/build.sh $(VARIANT)

# push-check first: a missing or malformed REGISTRY fails before a build of several minutes.
push: push-check images
	@RLSCALE_PUSH_TLS_VERIFY=$(PUSH_TLS_VERIFY) bash hack/images/push.sh "$(REGISTRY)" $(VARIANT) $(TAG)

push-check:
	@RLSCALE_PUSH_DRY_RUN=1 RLSCALE_PUSH_TLS_VERIFY=$(PUSH_TLS_VERIFY) bash hack/images/push.sh "$(REGISTRY)" $(VARIANT) $(TAG) >/dev/null

## make run: install, then run the quickstart RLRun on the embedded default (CPU); make run GPU=1: the CUDA
## install, then the same quickstart on GPU 0 (examples/quickstart-gpu.yaml).
RUN_SPEC ?= $(if $(filter 1 yes true,$(GPU)),examples/quickstart-gpu.yaml,examples/quickstart.yaml)
run: venv
	$(RLSCALE) run $(RUN_SPEC)

## make crd: regenerate the CRD and the README spec table from rlscale/spec/.
## make test: install, build/start what the tests need, run the whole suite in one pytest process.
## TEST_LANES=2 runs it as two pytest processes side by side instead (hack/test-lanes.sh; tests/lanes.py: the
## k8s lane tests/operator, node, images; the local lane the rest): on 2 cores both lanes took 58.8 min, no
## faster than one process (CI: 60 min), since each heavy file then ran at about half speed; on more cores
## it overlaps what one process waits for.
TEST_LANES ?= 1
## make disk: whether there is room for make test (hack/disk.py), checked before anything is built.
disk:
	@python3 hack/disk.py
test: disk venv k8s prometheus images
	$(VENV)/bin/ruff check .
	@if [ "$(TEST_LANES)" = 2 ]; then PY=$(PY) bash hack/test-lanes.sh $(PYTEST_ARGS); \
	else $(PY) -m pytest $(PYTEST_ARGS); fi

## make unit: the fast tests only (no cluster, no vLLM, no training), tests/operator's pure ones
## included, in UNIT_WORKERS pytest-xdist workers. A file whose every test is slow or cluster is not even
## imported (tests/unit_collect.py). On 2 nearly idle cores: 1,155 tests in 58 s with 2 workers, 79 s in one
## (`time make unit UNIT_WORKERS=2`, then `=0`); beside heavy jobs one worker was faster (107 s against 137 s),
## so there use UNIT_WORKERS=0. promtool checks the chart's alert rules, hence `prometheus`. Run it before every
## commit, with `make lint`. `make test` runs these and everything else.
UNIT_TESTS := tests/core tests/plan tests/trainer tests/rollout tests/operator
UNIT_WORKERS ?= 2
unit: venv prometheus
	$(PY) -m pytest -m "not slow and not cluster" -q -n $(UNIT_WORKERS) $(UNIT_TESTS) $(PYTEST_ARGS)

## make cluster: a real control plane (etcd, apiserver, controller-manager, scheduler, kwok
## with fake GPU nodes) with the RLRun CRD installed, plus a real node that runs containers
## (containerd, kubelet, kube-proxy, CoreDNS); CLUSTER_ARGS=--no-real-node for kwok only.
CLUSTER_ARGS ?= --real-node
cluster: venv k8s
	@bash hack/cluster/up.sh $(CLUSTER_ARGS)

cluster-down:
	@bash hack/cluster/down.sh

lint: venv
	$(VENV)/bin/ruff check .

crd: venv
	$(PY) hack/gen.py

bench: venv
	$(PY) bench/rollout_throughput.py
	$(PY) bench/learner_throughput.py
	$(PY) bench/operator_scale.py
	$(PY) bench/k8s_vs_local.py

## make gpu-check: the checks that decide whether the GPU path works (docs/gpu.md, "make gpu-check"):
## cuInit, CUDA IPC handover, the NCCL group NCCL must refuse, rlscale's DeepSpeed learner and its
## offload_states, HF decode; each against the planner, exit 1 on a miss of more than 2x. No venv step: a
## GPU machine's python3 with torch and transformers will do; the wheels `bash bench/gpu_checks/wheels.sh`
## puts in GPU_WHEELS (DeepSpeed and its dependencies) are installed beside it first where DeepSpeed is missing.
## Without a GPU it says so and exits 0; GPU_CHECK_ARGS=--cpu-smoke runs the checks' code on the CPU.
GPU_CHECK_PY ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_ARGS ?=
GPU_WHEELS ?= bench/out/gpu-wheels
GPU_WHEELS_DIR ?= $(CURDIR)/bench/out/gpu-wheels-installed
gpu-check:
	@if ls $(GPU_WHEELS)/*.whl >/dev/null 2>&1 && ! $(GPU_CHECK_PY) -c "import deepspeed" >/dev/null 2>&1; then \
	  $(GPU_CHECK_PY) -m pip install --quiet --no-index --no-deps --upgrade --target $(GPU_WHEELS_DIR) \
	    $(GPU_WHEELS)/*.whl; fi
	PYTHONPATH=$(GPU_WHEELS_DIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_CHECK_PY) bench/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
