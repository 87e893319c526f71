"""Tool pods' HTTP path over loopback (spec.task.toolSandbox.isolation: pod): `rlscale tool-server` as a tool pod
runs it, called by the driver's RemoteToolPool. A tool that hangs or prints a megabyte costs that call (the
per-call timeout and output limit hold across HTTP) and the next call is answered; a tool server that hangs,
is gone or answers too much costs the call too, never the driver."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from rlscale.runconfig import RunConfig
from rlscale.spec import parse_spec
from rlscale.trainer.tools.remote import RemoteToolPool
from rlscale.trainer.tools.sandbox import ToolDef
from rlscale.trainer.tools.setup import tool_defs, tool_pool

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S, LIMIT = 1.5, 100


def _spec(**sandbox):
    raw = yaml.safe_load((REPO / "examples/tools-quickstart.yaml").read_text())["spec"]
    raw = copy.deepcopy(raw)
    raw["task"].update(tools=[{"name": "calculator", "builtin": "calculator"},
                              {"name": "python", "builtin": "python", "timeoutSeconds": TIMEOUT_S,
                               "maxOutputChars": LIMIT}], toolWorkers=1, toolMemoryMb=512,
                       toolSandbox={"isolation": "pod", **sandbox})
    return parse_spec(raw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`rlscale tool-server` on a loopback port, as the tool pod's container runs it."""
    cfg = RunConfig(run="tools", spec=_spec()).save(tmp_path_factory.mktemp("cfg") / "run.json")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlscale.cli", "tool-server", "--config", str(cfg), "--port",
                             str(port)], stderr=subprocess.PIPE, text=True)
    yield f"http://127.0.0.1:{port}", proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def remote(server):
    url, proc = server
    spec = _spec()
    pool = tool_pool(spec, env={"RLSCALE_TOOL_SERVER": url})
    assert isinstance(pool, RemoteToolPool), proc.poll()
    yield pool
    pool.close()


def _after(pool) -> None:
    """The server still answers: the misbehaving call cost that call only."""
    assert pool.call("calculator", {"expression": "123*456"}).output == "56088"
    assert pool.call("python", {"code": "sum(range(10))"}).output.strip() == "45"


def test_calls_answer_over_http(remote):
    r = remote.call("python", {"code": "x = 6\nprint('x is', x)\nx * 7"})
    assert (r.kind, r.output) == ("ok", "x is 6\n42\n")
    assert remote.call("python", {"code": "1/0"}).kind == "error"
    assert remote.call("nope", {}).kind == "refused"


@pytest.mark.slow  # waits out a timeout or a killed worker by design (seconds): `make test`, not `make unit`
@pytest.mark.parametrize("code", ["while True: pass", "import time\ntime.sleep(60)"])
def test_a_hanging_tool_is_stopped_at_its_timeout(remote, code):
    t0 = time.monotonic()
    r = remote.call("python", {"code": code})
    took = time.monotonic() - t0
    assert r.kind in ("timeout", "died") and r.failed, r
    assert f"{TIMEOUT_S:g} s" in r.output or "ended its process" in r.output, r.output
    assert took < TIMEOUT_S + 4, took  # the server's kill, not the client's slack, ended it
    _after(remote)


def test_a_megabyte_of_output_is_cut_to_the_limit(remote):
    r = remote.call("python", {"code": "print('x' * 1_000_000)"})
    assert r.truncated and r.output.startswith("x" * LIMIT) and "more characters cut" in r.output
    assert len(r.output) < LIMIT + 60, len(r.output)
    _after(remote)


def test_calls_in_parallel_and_their_stats(remote):
    remote.take_stats()
    out = remote.call_many([("calculator", {"expression": f"{i}*3"}) for i in range(8)])
    assert [o.output for o in out] == [str(i * 3) for i in range(8)]
    s = remote.take_stats()
    assert s.calls == 8 and s.errors == 0 and s.isolation  # the server said how its workers cut the network


class _Misbehaving(BaseHTTPRequestHandler):
    """A tool server that is not one: it hangs, or answers far past the output limit, or not in JSON."""

    def log_message(self, *args):
        return

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        mode = self.server.mode
        if mode == "hang":
            time.sleep(30)
            return
        body = {"huge": json.dumps({"output": "y" * 100_000}), "long": json.dumps({"output": "y" * 500}),
                "junk": "<html>oops</html>"}[mode].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def misbehaving():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Misbehaving)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _client(url: str) -> RemoteToolPool:
    return RemoteToolPool([ToolDef("python", builtin="python", timeout_s=0.5, max_output_chars=LIMIT)], url,
                          slack_s=0.5)


@pytest.mark.parametrize("mode,kind,words", [("hang", "timeout", "no answer from the tool pods within 1 s"),
                                             ("huge", "died", "with no result"), ("junk", "died", "with no result"),
                                             ("long", "ok", "more characters cut")])
def test_a_misbehaving_tool_server_costs_the_call(misbehaving, mode, kind, words):
    misbehaving.mode = mode
    pool = _client(f"http://127.0.0.1:{misbehaving.server_address[1]}")
    t0 = time.monotonic()
    r = pool.call("python", {"code": "1"})
    assert time.monotonic() - t0 < 3
    assert r.kind == kind and words in r.output, r
    assert len(r.output) < LIMIT + 80
    pool.close()


def test_no_tool_server_costs_the_call():
    pool = _client(f"http://127.0.0.1:{_free_port()}")
    r = pool.call("python", {"code": "1"})
    assert r.kind == "died" and "failed at the tool pods" in r.output, r
    pool.close()


def test_wait_ready_names_the_field_when_no_pod_answers():
    pool = _client(f"http://127.0.0.1:{_free_port()}")
    with pytest.raises(RuntimeError, match="spec.task.toolSandbox: no tool pod answered"):
        pool.wait_ready(timeout=0.5)
    pool.close()


def test_off_kubernetes_the_tools_run_in_local_processes():
    pool = tool_pool(_spec(), env={})
    try:
        assert not isinstance(pool, RemoteToolPool)
        assert [t.name for t in tool_defs(_spec())] == list(pool.tools)
    finally:
        pool.close()


def test_the_turn_loop_runs_its_calls_through_the_tool_server(remote):
    """The driver's multi-turn loop, unchanged, with the tool server in place of the local pool: the scripted
    policy calls the calculator and copies the answer, which then is the product."""
    from rlscale.trainer.tools.environments import ToolEnvironment
    from rlscale.trainer.tools.loop import MultiTurnRollout, tool_metrics
    from rlscale.trainer.tools.task import build_tokenizer
    from tests.trainer.test_tools_loop import ScriptedPolicy, call

    tok = build_tokenizer()
    loop = MultiTurnRollout(ScriptedPolicy(tok, lambda text: call(text.rstrip("="))), tok, max_turns=3,
                            max_tokens=64, max_length=96, tools=ToolEnvironment(remote, tok))
    groups = loop.generate([tok(p).input_ids for p in ("347*58=", "120*11=")], 2, temperature=1.0, top_p=1.0,
                           max_new_tokens=16)
    texts = [t.text for g in groups for t in g]
    assert texts == ["20126", "20126", "1320", "1320"]
    m = tool_metrics([t for g in groups for t in g])
    assert m["calls"] == 4 and m["errors"] == 0 and m["turns"] == 2
