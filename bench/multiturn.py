"""Multi-turn rollouts on the real vLLM CPU engine: samples/s and engine utilisation of multi-turn trajectories
against single-turn samples of the same generated tokens, and of the many-in-flight loop against one trajectory
at a time. Everything runs side by side in one process, on one engine, repetitions interleaved.

The workload: builtin:tiny-tools on builtin:tool-arithmetic (products such as 347*58), through the rollout's
own MultiTurnRollout and the sandboxed calculator worker, on a RolloutEngine built as a run's replica builds it
(rollout/engine.py, one engine thread). The policy is the warm start with the call forced: each first turn
begins with <tool_call> (prefilled, as the warm start's eval forces it), so every trajectory is a call, the
calculator's answer and a final answer (2 turns), which is what the trained policy does (0.98 calls per
trajectory at the end of `rlscale run examples/tools-quickstart.yaml`, docs/tools.md). `--unforced` samples
the warm start as it is (about one call in seven); `--model DIR` takes another model of the same tokenizer.

Rows (each over the same prompts):
  multi-turn, in flight    MultiTurnRollout turn by turn: every unfinished trajectory in each turn's generate call
  multi-turn, overtaking   MultiTurnRollout(overtake=True): each trajectory's next turn sent as soon as its own
                           tool answers (trainer/tools/overtaking.py), whatever is ready in one call
  multi-turn, one at a time   the same, one trajectory after another
  single-turn, in flight   the same prompts in one generate call, each sample exactly as many generated tokens
                           as its multi-turn trajectory generated (ignore_eos): equal generated tokens, one turn
  single-turn, one at a time   the same, one sample after another

Engine utilisation, measured two ways: `seqs/step`, the mean number of sequences the engine advanced per
engine step (each step with output, counted at vLLM's engine core: the batch a forward pass runs), and
`busy`, the share of the wall clock spent inside the engine's generate calls (the rest: tokenising, parsing,
the tool calls, Python between turns).

    .venv/bin/python bench/multiturn.py                          # 64 trajectories, 3 repetitions (~1-2 min)
    .venv/bin/python bench/multiturn.py --trajectories 128 --reps 5
    .venv/bin/python bench/multiturn.py --tool-latency 1 --tool-spread uniform   # a remote tool: 0-1 s a call

`--tool-latency X` delays each tool call's answer by X/2 s (`--tool-spread equal`) or by a uniform 0-X s drawn
per call (`uniform`), as a tool behind the network would (wall-clock, no CPU); the turn-by-turn loop waits for
the turn's slowest answer, the overtaking one for each trajectory's own. With a latency the one-at-a-time rows
are left out unless `--one-at-a-time` (each trajectory would wait for its own calls in turn).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

ROWS = ("multi-turn, in flight", "multi-turn, overtaking", "multi-turn, one at a time", "single-turn, in flight",
        "single-turn, one at a time")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trajectories", type=int, default=64, help="trajectories (and single-turn samples) per row")
    p.add_argument("--reps", type=int, default=3, help="repetitions, interleaved; the table shows medians")
    p.add_argument("--model", default=None, help="a model dir with tiny-tools' tokenizer (default: the warm start)")
    p.add_argument("--unforced", action="store_true", help="sample the first turn freely (mostly single-turn)")
    p.add_argument("--max-new-tokens", type=int, default=12, help="per turn (examples/tools-quickstart.yaml's)")
    p.add_argument("--cpu-threads", type=int, default=1, help="engine threads (EngineConfig.cpu_threads)")
    p.add_argument("--tool-latency", type=float, default=0.0, help="seconds added to tool calls (see --tool-spread)")
    p.add_argument("--tool-spread", choices=("equal", "uniform"), default="equal",
                   help="equal: every call latency/2; uniform: each call 0-latency s")
    p.add_argument("--one-at-a-time", action="store_true", help="run the one-at-a-time rows with a tool latency too")
    return p.parse_args(argv)


class StepCounter:
    """Counts the engine's steps with output, the sequences they advanced and the tokens they produced, at
    vLLM's in-process engine core (one get_output is one scheduler step and one forward pass)."""

    def __init__(self, engine: Any):
        self.steps = self.seqs = self.tokens = 0
        core = engine.llm.llm_engine.engine_core
        inner = core.get_output

        def counted():
            out = inner()
            if out.outputs:
                self.steps += 1
                self.seqs += len(out.outputs)
                self.tokens += sum(len(o.new_token_ids) for o in out.outputs)
            return out

        core.get_output = counted

    def snapshot(self) -> tuple[int, int, int]:
        return self.steps, self.seqs, self.tokens


class EnginePort:
    """The rollout port (what MultiTurnRollout calls) over one RolloutEngine: times its generate calls, and with
    `force` prefills those tokens at the start of each first turn (a prompt of `firsts`) and returns them as the
    turn's first tokens, as if sampled."""

    def __init__(self, engine: Any, firsts: set[tuple[int, ...]], force: Sequence[int] = ()):
        self.engine, self.firsts, self.force = engine, firsts, list(force)
        self.seconds, self.calls = 0.0, 0
        self.lock = threading.Lock()  # the overtaking loop may call from several threads

    def generate(self, prompt_token_ids, samples_per_prompt, *, temperature, top_p, max_new_tokens, seed=None,
                 version=0):
        forced = [bool(self.force) and tuple(p) in self.firsts for p in prompt_token_ids]
        if any(forced) and not all(forced):
            raise ValueError("a generate call mixing first turns and later ones; the loop sends one turn at a time")
        extra = self.force if forced and forced[0] else []
        t0 = time.perf_counter()
        out = self.engine.generate([list(p) + extra for p in prompt_token_ids], samples_per_prompt,
                                   temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens - len(extra),
                                   seed=seed)
        with self.lock:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
        if not extra:
            return out
        return [[dataclasses.replace(s, token_ids=extra + s.token_ids, logprobs=[0.0] * len(extra) + s.logprobs)
                 for s in g] for g in out]


class LatencyTools:
    """The tools with each call's answer delayed as a remote tool's would be (--tool-latency): a turn's calls
    answered after the longest of their delays. A call's delay follows from its text and `salt`, so both loops
    meet the same delays."""

    def __init__(self, inner: Any, latency: float, spread: str, salt: int = 0):
        self.inner, self.latency, self.spread, self.salt = inner, latency, spread, salt

    @property
    def pool(self) -> Any:
        return self.inner.pool

    def delay(self, text: str) -> float:
        if self.latency <= 0:
            return 0.0
        if self.spread == "equal":
            return self.latency / 2
        return random.Random(f"{self.salt}:{text}").uniform(0.0, self.latency)

    def step_many(self, texts: list[str]) -> list[Any]:
        out = self.inner.step_many(texts)
        delays = [self.delay(t) for t, o in zip(texts, out, strict=True) if o.calls]
        if delays:
            time.sleep(max(delays))
        return out


def generated_lengths(trajectories: Sequence[Any], forced: int) -> list[int]:
    """Tokens the engine generated for each trajectory: its model tokens (mask 1) less the `forced` prefilled
    ones of its first turn."""
    return [sum(t.mask) - forced for t in trajectories]


def fixed_length(engine: Any, prompts: Sequence[Sequence[int]], lengths: Sequence[int], seed: int) -> None:
    """One engine call generating exactly lengths[i] tokens after prompts[i] (ignore_eos), each request its own
    length in one batch: RolloutEngine.generate takes one length per call. Single-threaded here, so the engine's
    lock is not needed."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine._own_threads()  # this thread's OpenMP team at the engine's size, as RolloutEngine.generate does

    params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, max_tokens=n, seed=seed + i, logprobs=0,
                             ignore_eos=True, stop_token_ids=[], detokenize=False) for i, n in enumerate(lengths)]
    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    got = [len(o.outputs[0].token_ids) for o in outs]
    if got != list(lengths):
        raise RuntimeError(f"fixed-length generation made {sum(got)} tokens, asked for {sum(lengths)}")


def summarise(samples: int, turns: float, gen_tokens: int, wall_s: float, engine_s: float, engine_calls: int,
              steps: int, seqs: int, tool_wall_s: float = 0.0) -> dict[str, float]:
    """One run's figures: rates per wall second, sequences per engine step, the engine's busy share."""
    return {"samples": samples, "turns": turns, "gen_tokens": gen_tokens, "wall_s": wall_s,
            "samples_per_s": samples / wall_s, "tokens_per_s": gen_tokens / wall_s, "engine_calls": engine_calls,
            "steps": steps, "seqs_per_step": seqs / steps if steps else 0.0, "busy": engine_s / wall_s,
            "tool_wall_s": tool_wall_s}


def medians(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def ratios(table: dict[str, dict[str, float]]) -> dict[str, float]:
    """The headline ratios (samples/s): multi-turn in flight over single-turn in flight at equal generated
    tokens, overtaking over turn by turn, and in flight over one at a time (multi-turn; single-turn's too),
    for the rows the table has."""
    m, m1 = table["multi-turn, in flight"], table.get("multi-turn, one at a time")
    s, s1 = table["single-turn, in flight"], table.get("single-turn, one at a time")
    out = {"multi_vs_single": m["samples_per_s"] / s["samples_per_s"]}
    if "multi-turn, overtaking" in table:
        out["overtaking_vs_turns"] = table["multi-turn, overtaking"]["samples_per_s"] / m["samples_per_s"]
    if m1 is not None and s1 is not None:
        out.update(in_flight_vs_one=m["samples_per_s"] / m1["samples_per_s"],
                   single_in_flight_vs_one=s["samples_per_s"] / s1["samples_per_s"])
    return out


def format_table(table: dict[str, dict[str, float]]) -> str:
    head = (f"{'':28} {'turns':>5} {'gen tok':>7} {'wall s':>7} {'samples/s':>9} {'tok/s':>7} {'calls':>5} "
            f"{'steps':>5} {'seqs/step':>9} {'busy':>5}")
    lines = [head]
    for name, r in table.items():
        lines.append(f"{name:28} {r['turns']:>5.2f} {r['gen_tokens']:>7.0f} {r['wall_s']:>7.2f} "
                     f"{r['samples_per_s']:>9.1f} {r['tokens_per_s']:>7.0f} {r['engine_calls']:>5.0f} "
                     f"{r['steps']:>5.0f} {r['seqs_per_step']:>9.1f} {r['busy']:>5.0%}")
    return "\n".join(lines)


def run_multi(rollout, port, counter, ids, in_flight: bool, max_new: int, seed: int):
    before, calls0, secs0 = counter.snapshot(), port.calls, port.seconds
    t0 = time.perf_counter()
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=max_new)
    if in_flight:
        trajs = [t for g in rollout.generate(ids, 1, seed=seed, **kw) for t in g]
    else:
        trajs = [rollout.generate([p], 1, seed=seed + i, **kw)[0][0] for i, p in enumerate(ids)]
    wall = time.perf_counter() - t0
    steps, seqs, tokens = (a - b for a, b in zip(counter.snapshot(), before, strict=True))
    row = summarise(len(trajs), statistics.mean(t.turns for t in trajs), tokens, wall, port.seconds - secs0,
                    port.calls - calls0, steps, seqs, sum(t.tool_wall for t in trajs))
    return row, trajs


def run_single(engine, counter, ids, lengths, in_flight: bool, seed: int):
    before = counter.snapshot()
    t0 = time.perf_counter()
    if in_flight:
        fixed_length(engine, ids, lengths, seed)
    else:
        for i, (p, n) in enumerate(zip(ids, lengths, strict=True)):
            fixed_length(engine, [p], [n], seed + i)
    wall = time.perf_counter() - t0
    steps, seqs, tokens = (a - b for a, b in zip(counter.snapshot(), before, strict=True))
    return summarise(len(ids), 1.0, tokens, wall, wall, 1 if in_flight else len(ids), steps, seqs)


def main(argv=None) -> int:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from rlscale.rollout.engine import EngineConfig, RolloutEngine
    from rlscale.trainer.builtin import ensure_builtin_model
    from rlscale.trainer.tools.calls import CALL_OPEN
    from rlscale.trainer.tools.environments import ToolEnvironment
    from rlscale.trainer.tools.loop import MultiTurnRollout, tool_metrics
    from rlscale.trainer.tools.sandbox import ToolDef, ToolPool
    from rlscale.trainer.tools.task import ToolArithmeticTask

    t_start, load0 = time.perf_counter(), os.getloadavg()[0]
    path = str(args.model or ensure_builtin_model("builtin:tiny-tools", progress=False))
    tok = AutoTokenizer.from_pretrained(path)
    ids = [tok(p.prompt).input_ids for p in ToolArithmeticTask().train[: args.trajectories]]
    force = [] if args.unforced else [tok.convert_tokens_to_ids(CALL_OPEN)]
    # As tools-quickstart's replica: its maxLength 48 and trajectory budget 36.
    engine = RolloutEngine(EngineConfig(model=path, max_model_len=48, max_num_seqs=args.trajectories,
                                        kv_cache_bytes=64 * 2**20, cpu_threads=args.cpu_threads))
    counter = StepCounter(engine)
    port = EnginePort(engine, {tuple(p) for p in ids}, force)
    pool = ToolPool([ToolDef("calculator", builtin="calculator", max_output_chars=64)], workers=1)
    tools = LatencyTools(ToolEnvironment(pool, tok), args.tool_latency, args.tool_spread)
    loop = dict(max_turns=2, max_tokens=36, max_length=48, tools=tools)
    rollout = MultiTurnRollout(port, tok, **loop)
    overtaking = MultiTurnRollout(port, tok, overtake=True, **loop)
    one_at_a_time = args.tool_latency <= 0 or args.one_at_a_time
    try:
        run_multi(rollout, port, counter, ids, True, args.max_new_tokens, seed=10_000)  # warm-up: kernels, shapes
        run_multi(overtaking, port, counter, ids, True, args.max_new_tokens, seed=10_000)
        names = [n for n in ROWS if one_at_a_time or "one at a time" not in n]
        runs: dict[str, list[dict]] = {name: [] for name in names}
        calls = []
        for rep in range(args.reps):
            seed = tools.salt = 1000 * rep
            # Turn by turn and overtaking alternate which goes first, so neither always meets a warmer machine.
            pair = [(ROWS[0], rollout), (ROWS[1], overtaking)][:: 1 if rep % 2 == 0 else -1]
            for name, r in pair:
                row, trajs = run_multi(r, port, counter, ids, True, args.max_new_tokens, seed)
                runs[name].append(row)
                if name == ROWS[0]:
                    first, calls = row, calls + [tool_metrics(trajs)["calls_per_trajectory"]]
                    lengths = generated_lengths(trajs, len(force))
            runs[ROWS[3]].append(run_single(engine, counter, ids, lengths, True, seed))
            if one_at_a_time:
                runs[ROWS[2]].append(run_multi(rollout, port, counter, ids, False, args.max_new_tokens, seed)[0])
                runs[ROWS[4]].append(run_single(engine, counter, ids, lengths, False, seed))
            if runs[ROWS[3]][-1]["gen_tokens"] != first["gen_tokens"]:
                raise RuntimeError(f"unequal tokens: single-turn {runs[ROWS[3]][-1]['gen_tokens']}, "
                                   f"multi-turn {first['gen_tokens']}")
    finally:
        pool.close()
        engine.close()
    table = {name: medians(rs) for name, rs in runs.items()}
    r = ratios(table)
    policy = "warm start, sampled" if args.unforced else "warm start, call forced"
    latency = (f"tool latency {args.tool_spread} {args.tool_latency:g} s" if args.tool_latency > 0
               else "no added tool latency")
    print(f"multi-turn bench: {path}, {policy}; {args.trajectories} trajectories x {args.reps} reps (medians), "
          f"1 vLLM CPU engine ({args.cpu_threads} thread), calculator in 1 sandboxed worker, {latency}")
    print(f"load average (1 min) {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end, on {os.cpu_count()} cores; "
          f"calls per trajectory {statistics.median(calls):.2f}; tool wall s per in-flight run "
          f"{table[ROWS[0]]['tool_wall_s']:.2f} (turn by turn), {table[ROWS[1]]['tool_wall_s']:.2f} (overtaking)")
    print(format_table(table))
    print(f"multi-turn vs single-turn at equal generated tokens (in flight), samples/s: x{r['multi_vs_single']:.2f}")
    print(f"overtaking vs turn by turn (multi-turn), samples/s: x{r['overtaking_vs_turns']:.2f}")
    if "in_flight_vs_one" in r:
        print(f"many in flight vs one at a time (multi-turn), samples/s: x{r['in_flight_vs_one']:.1f} "
              f"(single-turn: x{r['single_in_flight_vs_one']:.1f})")
    print(f"({time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
