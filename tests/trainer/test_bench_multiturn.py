"""bench/multiturn.py's pure helpers: the equal-token lengths, the per-run figures, the ratios and the table
(the bench itself runs vLLM and is measured by hand: docs/tools.md)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import multiturn  # noqa: E402  (bench/ is not a package)


def test_generated_lengths_drop_the_forced_tokens_only():
    trajs = [SimpleNamespace(mask=[1] * 11 + [0] * 7 + [1] * 6), SimpleNamespace(mask=[1] * 5)]
    assert multiturn.generated_lengths(trajs, 1) == [16, 4]
    assert multiturn.generated_lengths(trajs, 0) == [17, 5]


def test_summarise_rates_and_utilisation():
    r = multiturn.summarise(samples=64, turns=2.0, gen_tokens=1024, wall_s=2.0, engine_s=1.5, engine_calls=2,
                            steps=32, seqs=1024)
    assert r["samples_per_s"] == pytest.approx(32.0)
    assert r["tokens_per_s"] == pytest.approx(512.0)
    assert r["seqs_per_step"] == pytest.approx(32.0)
    assert r["busy"] == pytest.approx(0.75)
    assert multiturn.summarise(1, 1.0, 0, 1.0, 0.0, 0, 0, 0)["seqs_per_step"] == 0.0  # no step: no division


def test_ratios_and_table_name_every_row():
    def row(sps):
        return multiturn.summarise(samples=10, turns=1.0, gen_tokens=100, wall_s=10 / sps, engine_s=1.0,
                                   engine_calls=1, steps=10, seqs=100)

    table = dict(zip(multiturn.ROWS, [row(20.0), row(30.0), row(4.0), row(40.0), row(5.0)], strict=True))
    r = multiturn.ratios(table)
    assert r["multi_vs_single"] == pytest.approx(0.5)
    assert r["overtaking_vs_turns"] == pytest.approx(1.5)
    assert r["in_flight_vs_one"] == pytest.approx(5.0)
    assert r["single_in_flight_vs_one"] == pytest.approx(8.0)
    text = multiturn.format_table(table)
    assert all(name in text for name in multiturn.ROWS)
    assert len(text.splitlines()) == 1 + len(multiturn.ROWS)
    # With a tool latency the one-at-a-time rows are left out, and so are their ratios.
    short = {k: v for k, v in table.items() if "one at a time" not in k}
    assert set(multiturn.ratios(short)) == {"multi_vs_single", "overtaking_vs_turns"}


def test_tool_latency_per_call():
    class Tools:
        pool = None

        def step_many(self, texts):
            return [SimpleNamespace(calls=int("call" in t)) for t in texts]

    equal = multiturn.LatencyTools(Tools(), 0.2, "equal")
    assert equal.delay("call a") == equal.delay("call b") == pytest.approx(0.1)
    spread = multiturn.LatencyTools(Tools(), 1.0, "uniform", salt=3)
    delays = [spread.delay(f"call {i}") for i in range(50)]
    assert all(0.0 <= d <= 1.0 for d in delays) and max(delays) - min(delays) > 0.5
    assert spread.delay("call 7") == delays[7]  # the same call meets the same delay in both loops
    assert multiturn.LatencyTools(Tools(), 0.0, "uniform").delay("call") == 0.0
    t0 = time.perf_counter()
    equal.step_many(["answer", "call x"])  # one call: the turn waits for its delay
    assert time.perf_counter() - t0 >= 0.1


def test_medians_per_key():
    runs = [{"a": 1.0, "b": 9.0}, {"a": 3.0, "b": 1.0}, {"a": 2.0, "b": 5.0}]
    assert multiturn.medians(runs) == {"a": 2.0, "b": 5.0}
