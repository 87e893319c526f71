"""Helpers for the learner tests: a small random model and learner ranks as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlscale.roles import free_port

WORKER = Path(__file__).with_name("learner_worker.py")
# DeepSpeed compiles a shared-memory op on first use; share the cache with `make`.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "rlscale" / "torch_extensions"))


@pytest.fixture(scope="session")
def small_model(tmp_path_factory) -> Path:
    """A random 2-layer Qwen2 (head dim 64, as vLLM's CPU build needs) with the character tokenizer."""
    from rlscale.trainer.modeling import save_random_model

    return save_random_model(tmp_path_factory.mktemp("model") / "m", hidden_size=128, num_layers=2, num_heads=2,
                             head_dim=64, intermediate_size=256, seed=0)


def start_ranks(mode: str, args: dict, workdir: Path, world_size: int = 1, worker: Path = WORKER,
                threads: int | None = None) -> list:
    """Start `world_size` learner ranks (`worker MODE ARGS_JSON`) on loopback; not waited for (finish_ranks).
    `threads`: each rank's torch threads (default: 1 with several ranks, else 2)."""
    workdir.mkdir(parents=True, exist_ok=True)
    args_path = workdir / f"args-{mode}-{args.get('tag', '')}.json"
    args_path.write_text(json.dumps(args))
    port = free_port()
    threads = threads if threads is not None else (1 if world_size > 1 else 2)
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORKER_THREADS=str(threads), PYTHONUNBUFFERED="1")
        log = open(workdir / f"{mode}-{args.get('tag', '')}-rank{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, str(worker), mode, str(args_path)], env=env,
                                       stdout=log, stderr=subprocess.STDOUT), log))
    return procs


def finish_ranks(procs: list, timeout: float = 600, expect_kill: bool = False) -> list[subprocess.CompletedProcess]:
    """Wait for the ranks start_ranks started; a rank that exits non-zero fails the test unless `expect_kill`."""
    results = []
    try:
        for proc, log in procs:
            proc.wait(timeout=timeout)
            log.close()
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, Path(log.name).read_text(), ""))
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for r in results:
        if r.returncode != 0 and not expect_kill:
            raise AssertionError(f"learner rank exited {r.returncode}:\n{r.stdout[-4000:]}")
    return results


def _run_ranks(mode: str, args: dict, workdir: Path, world_size: int = 1, timeout: float = 600,
               expect_kill: bool = False, worker: Path = WORKER) -> list[subprocess.CompletedProcess]:
    """Start `world_size` learner ranks (`worker MODE ARGS_JSON`) on loopback and wait for all of them."""
    return finish_ranks(start_ranks(mode, args, workdir, world_size, worker), timeout, expect_kill)


@pytest.fixture
def run_ranks():
    """Start learner ranks as processes: run_ranks(mode, args, workdir, world_size=1, ...)."""
    return _run_ranks


@pytest.fixture(scope="module")
def run_ranks_module():
    """run_ranks for module-scoped fixtures (one run shared by several tests)."""
    return _run_ranks


@pytest.fixture(scope="module")
def tok():
    """The builtin tool task's tokenizer (the multi-turn loop's tests)."""
    from rlscale.trainer.tools.task import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="module")
def tools(tok):
    """A tool environment with the calculator in two sandboxed workers."""
    from rlscale.trainer.tools.environments import ToolEnvironment
    from rlscale.trainer.tools.sandbox import ToolDef, ToolPool

    pool = ToolPool([ToolDef("calculator", builtin="calculator")], workers=2)
    yield ToolEnvironment(pool, tok)
    pool.close()
