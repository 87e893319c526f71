"""The tool workers: a tool that hangs, crashes, prints a megabyte, eats memory or tries the network costs that
call only; the worker is replaced and the next call is answered."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from rlscale.trainer.tools.sandbox import ToolDef, ToolPool


@pytest.fixture(scope="module")
def pool():
    p = ToolPool([ToolDef("calculator", builtin="calculator"),
                  ToolDef("python", builtin="python", timeout_s=1.5, max_output_chars=100)], workers=2,
                 memory_mb=512)
    yield p
    p.close()


def _after(pool: ToolPool) -> None:
    """The pool still answers: the misbehaving call cost that call only."""
    assert pool.call("calculator", {"expression": "123*456"}).output == "56088"
    assert pool.call("python", {"code": "sum(range(10))"}).output.strip() == "45"


def test_calls_answer_and_errors_are_observations(pool):
    r = pool.call("python", {"code": "x = 6\nprint('x is', x)\nx * 7"})
    assert (r.kind, r.output) == ("ok", "x is 6\n42\n")
    bad = pool.call("python", {"code": "1/0"})
    assert bad.kind == "error" and "ZeroDivisionError" in bad.output
    assert pool.call("calculator", {"expression": "2**1000"}).kind == "error"


@pytest.mark.slow  # waits out a timeout or a killed worker by design (seconds): `make test`, not `make unit`
def test_a_hanging_call_is_stopped_at_its_timeout(pool):
    for code in ("while True: pass", "import time\ntime.sleep(60)"):
        r = pool.call("python", {"code": code})
        assert r.kind == "timeout" and 1.4 < r.seconds < 5
    _after(pool)


def test_a_crashing_call_ends_only_its_worker(pool):
    replaced = pool.stats.replaced
    r = pool.call("python", {"code": "import os\nos._exit(3)"})
    assert r.kind == "died" and "exit status 3" in r.output
    assert pool.stats.replaced == replaced + 1
    _after(pool)


def test_a_megabyte_of_output_is_cut_to_the_limit(pool):
    r = pool.call("python", {"code": "print('a' * 1_000_000)"})
    assert r.truncated and r.output.startswith("a" * 100) and "more characters cut" in r.output
    assert len(r.output) < 200
    _after(pool)


def test_memory_past_the_limit_fails_the_call(pool):
    r = pool.call("python", {"code": "x = bytearray(2 * 1024**3)"})
    assert r.kind in ("error", "died") and ("MemoryError" in r.output or "ended its process" in r.output)
    _after(pool)


def test_the_network_files_and_processes_are_out_of_reach(pool):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        net = pool.call("python", {"code": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 1)"})
    finally:
        server.close()
    assert net.kind == "error" and "socket" in net.output
    write = pool.call("python", {"code": "open('/tmp/rlscale-tool-wrote', 'w').write('x')"})
    assert write.kind == "error" and "not allowed" in write.output
    proc = pool.call("python", {"code": "import subprocess\nsubprocess.run(['true'])"})
    assert proc.kind == "error" and "not allowed" in proc.output
    _after(pool)


def test_the_workers_network_namespace_has_no_route_even_past_python():
    """The kernel's part, without the audit hook: after drop_network a connection to a listening loopback port
    fails (where user namespaces are disabled drop_network says so and this is skipped by its own answer)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = textwrap.dedent(f"""
        import socket, sys
        from rlscale.trainer.tools.worker import drop_network
        socket.create_connection(("127.0.0.1", {port}), 2).close()  # reachable before
        if not drop_network():
            sys.exit(3)
        try:
            socket.create_connection(("127.0.0.1", {port}), 2)
        except OSError as exc:
            print("refused", exc.errno)
            sys.exit(0)
        sys.exit(1)
    """)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    finally:
        server.close()
    if out.returncode == 3:
        pytest.fail("user namespaces are disabled here: the workers rely on the audit hook alone")
    assert out.returncode == 0 and "refused" in out.stdout, out.stderr


def test_an_unknown_tool_is_refused_without_a_worker(pool):
    r = pool.call("search", {"q": "x"})
    assert r.kind == "refused" and "calculator" in r.output


def test_a_plugin_tool_runs_in_a_worker(tmp_path, monkeypatch):
    (tmp_path / "mytools.py").write_text("def shout(text=''):\n    return text.upper()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    p = ToolPool([ToolDef("shout", function="mytools:shout")], workers=1)
    try:
        assert p.call("shout", {"text": "hi"}).output == "HI"
        assert p.call("shout", {"nope": 1}).kind == "error"
    finally:
        p.close()
