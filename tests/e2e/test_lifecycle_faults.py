"""`helios serve`'s process lifecycle under faults an operator meets: signals while the model loads,
a serving process killed outright, mistakes on the command line.

A load is made slow (and observable) by a driver script that runs `helios` with the runtime's
`build_runtime` wrapped: the engine process imports the driver as its main module (multiprocessing's
spawn), so the wrapper runs there, writes the engine process's id to a file and waits before loading. Where
`helios serve` runs in the test's own process, `support.slow_load` gives its engine process the same wrapper.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from support.server_core import SERVED_ID, ServerProcess, read_stream, tiny_core
from support.sweeps import in_sweep

SLOW_LOAD_DRIVER = """
import os, sys, time
from pathlib import Path

import helios.runtime.service as service

_build_runtime = service.build_runtime


def slow_build_runtime(*args, **kwargs):
    Path(os.environ["LOADING_MARK"]).write_text(str(os.getpid()))
    time.sleep(float(os.environ.get("LOAD_DELAY_S", "60")))
    return _build_runtime(*args, **kwargs)


service.build_runtime = slow_build_runtime

if __name__ == "__main__":
    from helios.cli.main import main

    sys.exit(main())
"""


def is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while is_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class LoadingServer:
    """`helios serve CORE --port 0` through the slow-load driver, signalled once its engine process
    is loading; the engine process is killed at the end whatever the test saw."""

    def __init__(self, core, tmp_path: Path, *options: str):
        driver = tmp_path / "slow_load_driver.py"
        driver.write_text(SLOW_LOAD_DRIVER)
        self.mark = tmp_path / "loading.pid"
        self.log = tmp_path / "server.log"
        env = dict(os.environ, LOADING_MARK=str(self.mark), PYTHONUNBUFFERED="1")
        command = [sys.executable, str(driver), "serve", str(core.path), "--accept", core.namespace,
                   "--trust", str(core.public_key), "--port", "0", *options]
        with open(self.log, "w") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        self.engine_pid = None

    def wait_loading(self, timeout: float = 120.0) -> int:  # two processes' imports: minutes on a crowded machine
        deadline = time.monotonic() + timeout
        while not (self.mark.is_file() and self.mark.read_text()):
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the engine process never started loading"
            time.sleep(0.05)
        self.engine_pid = int(self.mark.read_text())
        return self.engine_pid

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.engine_pid is not None and is_running(self.engine_pid):
            os.kill(self.engine_pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    return tiny_core(tmp_path_factory.getbasetemp())


@pytest.fixture
def loading(core, tmp_path):
    server = LoadingServer(core, tmp_path)
    yield server
    server.close()


# SIGHUP and SIGINT run with HELIOS_SERVE_SIGNAL_SWEEP=1: `_stop_signals_unwind` gives SIGHUP SIGTERM's handler
# and SIGINT the same `_StopSignal` (the engine process stopped as for SIGTERM, which the SIGTERM case takes by
# default); SIGINT's exit (130, one line, once unwound) is test_sigint_during_an_in_process_load_exits_130_with_one_line's.
@pytest.mark.parametrize("signum, code, line", in_sweep("HELIOS_SERVE_SIGNAL_SWEEP", (
    (signal.SIGTERM, -signal.SIGTERM, "helios serve: stopped by SIGTERM while starting"),
), (
    (signal.SIGINT, 130, "helios serve: interrupted"),
    (signal.SIGHUP, -signal.SIGHUP, "helios serve: stopped by SIGHUP while starting"),
)))
def test_a_stop_signal_while_the_model_loads_stops_the_engine_process_at_once(loading, signum, code, line):
    """Before: SIGTERM and SIGHUP ended the serving process and left the engine process loading, an
    orphan that then printed a BrokenPipeError traceback; SIGINT waited for the whole load."""
    engine_pid = loading.wait_loading()
    loading.process.send_signal(signum)
    assert loading.process.wait(timeout=10) == code
    assert wait_gone(engine_pid, 5), "the engine process outlived the serving process"
    log = loading.log.read_text()
    assert line in log and "Traceback" not in log, log


def test_sigint_during_an_in_process_load_exits_130_with_one_line(core, monkeypatch, capsys):
    """Before: `--no-engine-process` interrupted while loading now and then exited by the signal (-2)
    after printing "interrupted": the KeyboardInterrupt went through torch's native code, which left
    CPython's unhandled-KeyboardInterrupt mark set though the command caught it. Now the load sees
    an exception of the start's own, and the KeyboardInterrupt is raised once it unwound."""
    from helios.cli import serve_run
    from helios.cli.main import main

    seen = []

    def interrupted_load(*args, **kwargs):
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(10)
        except BaseException as error:
            seen.append(type(error))
            raise
        raise AssertionError("SIGINT did not stop the load")

    monkeypatch.setattr(serve_run, "build_runtime", interrupted_load)
    assert main(core_argv(core, "--port", "0", "--no-engine-process")) == 130
    assert seen and not issubclass(seen[0], KeyboardInterrupt), seen
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("helios serve: loading ") and lines[1:] == ["helios serve: interrupted"], lines
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_killed_serving_process_stops_its_loading_engine_process(loading):
    """Before: after kill -9 of the serving process its engine process loaded on for nobody, then
    printed a BrokenPipeError traceback."""
    engine_pid = loading.wait_loading()
    loading.process.kill()
    loading.process.wait()
    assert wait_gone(engine_pid, 5), "the engine process loaded on as an orphan"
    log = loading.log.read_text()
    assert "the serving process is gone" in log and "Traceback" not in log, log


def test_an_engine_process_killed_while_loading_is_named_in_the_error(core, tmp_path, monkeypatch, capfd):
    """Before: "the engine process ended while starting (exit code -9)"; an OOM kill reads so now. `helios serve`
    runs in this process (its exit status is `main`'s; a serving process of its own would pay the imports of
    torch and helios again), its engine process spawned as ever, with a load that waits (`support.slow_load`)."""
    from helios.cli import serve_cmd
    from helios.cli.main import main
    from helios.server.engine_spawn import spawn_engine_process
    from support.slow_load import slow_engine_main

    mark = tmp_path / "loading.pid"
    monkeypatch.setattr(serve_cmd, "spawn_engine_process",
                        functools.partial(spawn_engine_process, functools.partial(slow_engine_main, str(mark), 60.0)))
    killed = []

    def kill_once_loading() -> None:
        deadline = time.monotonic() + 120  # the engine process's imports: a minute on a crowded machine
        while not (mark.is_file() and mark.read_text()):
            if time.monotonic() > deadline:  # never loading: stop `helios serve` (exit 130), failing, not hanging
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)
        killed.append(int(mark.read_text()))
        os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_once_loading, daemon=True)
    killer.start()
    code = main(core_argv(core, "--port", "0"))
    killer.join(10)
    out, err = capfd.readouterr()
    assert killed, "the engine process never started loading"
    assert code == 9, err
    assert "helios serve: error: the engine process was killed by SIGKILL while starting" in err, err
    assert "Traceback" not in err, err


def core_argv(core, *options: str) -> list[str]:
    return ["serve", str(core.path), "--accept", core.namespace, "--trust", str(core.public_key), *options]


def record_spawns(monkeypatch) -> list:
    """The engine processes `helios serve` starts ahead of their load orders (`helios.server.engine_spawn`)."""
    from helios.cli import serve_cmd
    from helios.server.engine_spawn import spawn_engine_process

    spawned = []

    def spawn(**kwargs):
        spawned.append(spawn_engine_process(**kwargs))
        return spawned[-1]

    monkeypatch.setattr(serve_cmd, "spawn_engine_process", spawn)
    return spawned


@pytest.fixture
def no_load(monkeypatch):
    """Fails the test if `helios serve` gets as far as loading the model, or leaves behind an engine
    process it started ahead (`helios.server.engine_spawn`) without ordering it to load."""
    from helios.cli import serve_run

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the mistake was reported")

    spawned = record_spawns(monkeypatch)
    monkeypatch.setattr(serve_run, "start_engine_process", load)
    monkeypatch.setattr(serve_run, "build_runtime", load)
    yield spawned
    assert [spawn.process.exitcode for spawn in spawned] == [-signal.SIGKILL] * len(spawned)


def test_a_taken_port_or_an_unknown_host_fails_before_the_model_loads(core, no_load, capsys):
    """Before: the model loaded first (minutes for a large core), then the bind failed. The engine
    process started ahead of the bind is stopped (the fixture checks)."""
    from helios.cli.main import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(core_argv(core, "--port", str(port))) == 1
    assert f"helios serve: error: cannot listen on 127.0.0.1:{port}: Address already in use" in capsys.readouterr().err
    assert main(core_argv(core, "--host", "no-such-host.invalid", "--port", "0")) == 1
    err = capsys.readouterr().err
    assert "cannot listen on no-such-host.invalid:0" in err and "while attempting" not in err, err
    assert len(no_load) == 2


def test_a_port_another_starting_server_holds_fails_before_the_model_loads(core, no_load, capsys):
    """Before: with SO_REUSEADDR set at the bind, a second `helios serve` on the port of one still
    loading (bound, not yet listening) bound it too, loaded its whole model and failed only at
    `listen`. A port that only connections of an earlier server hold (TIME_WAIT) is still taken."""
    from helios.cli.main import main
    from helios.server.serve import bind

    with contextlib.closing(bind("127.0.0.1", 0)) as loading:  # the first server, loading its model
        port = loading.getsockname()[1]
        assert main(core_argv(core, "--port", str(port))) == 1
        assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in capsys.readouterr().err
        loading.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as `serve` listens
        loading.listen(1)
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = loading.accept()
            accepted.close()  # the server's end closes first: its side waits out TIME_WAIT
            client.recv(1)
    with contextlib.closing(bind("127.0.0.1", port)) as restarted:
        assert restarted.getsockname()[1] == port


def test_an_ipv6_host_in_brackets_listens_on_that_address(core, no_load, capsys):
    """Before: `--host [::1]` (an IPv6 literal as URLs write it, and as the listening line prints it)
    failed as "Name or service not known"; the bare literal worked. The port taken on ::1 shows the
    bracketed host reached that address (and still fails before the load)."""
    from helios.cli.main import main
    from helios.server.serve import bind

    with contextlib.closing(bind("[::1]", 0)) as sock:
        assert sock.getsockname()[:2] == ("::1", sock.getsockname()[1])
        sock.listen(1)
        port = sock.getsockname()[1]
        assert main(core_argv(core, "--host", "[::1]", "--port", str(port))) == 1
    assert f"cannot listen on [::1]:{port}: Address already in use" in capsys.readouterr().err
    assert main(core_argv(core, "--host", "[]", "--port", "0")) == 1  # never every interface
    assert "cannot listen on []:0" in capsys.readouterr().err


@pytest.mark.parametrize("option, value, message", [
    ("--header-timeout", "nan", "--header-timeout must be positive and finite"),
    ("--body-timeout", "inf", "--body-timeout must be positive and finite"),
    ("--send-timeout", "nan", "--send-timeout must be positive and finite"),
    ("--frontend-workers", "100000", "--frontend-workers must be at most"),
    ("--torch-threads", "100000", "--torch-threads must be at most"),
    ("--drain-seconds", "nan", "--drain-seconds must be positive and finite"),
])
def test_infinite_timeouts_and_thread_counts_past_any_use_are_refused(option, value, message, no_load, capsys):
    """Before: a nan head timeout served, but every connection hung with a ValueError traceback in
    the log; 100000 frontend workers or torch threads ended in a traceback ("can't start new
    thread") or a segmentation fault."""
    from helios.cli.main import main

    assert main(["serve", "--port", "0", option, value]) == 2
    assert message in capsys.readouterr().err


def test_drain_seconds_reach_the_server(monkeypatch):
    """`--drain-seconds` (default `DRAIN_SECONDS`) becomes the server's drain; the drain tests here
    and in test_server_faults serve with a short one."""
    from helios.cli import serve_run
    from helios.cli.main import main
    from helios.server.defaults import DRAIN_SECONDS

    class Runtime:
        def close(self):
            pass

    served = []
    monkeypatch.setattr(serve_run, "_start", lambda args, options, spawned, started: (Runtime(), "owner", None))
    monkeypatch.setattr(serve_run, "serve", lambda runtime, options, **kwargs: served.append(options) or 0)
    assert main(["serve", "--port", "0", "--no-engine-process", "--drain-seconds", "0.5"]) == 0
    assert main(["serve", "--port", "0", "--no-engine-process"]) == 0
    assert [options.drain_seconds for options in served] == [0.5, DRAIN_SECONDS]


def test_startup_options_the_core_refuses_fail_with_their_type_before_the_load(core, monkeypatch, capsys):
    """Before: the engine process loaded the model, then refused the option; its error did not
    pickle, so it arrived as an ExecutionError (exit 9, "StartupOptionError: ..." in the text). The
    serving process's own check reports it; the engine process started ahead (loading the order it made
    from the command line, `helios.cli.serve_order`) is never handed this one, and is stopped."""
    from helios.cli.main import main
    from helios.server.engine_spawn import EngineSpawn

    def order(*args):
        raise AssertionError("the engine process was ordered to load before the option was refused")

    monkeypatch.setattr(EngineSpawn, "order", order)
    spawned = record_spawns(monkeypatch)
    assert main(core_argv(core, "--port", "0", "--max-active", "100000")) == 2
    err = capsys.readouterr().err
    assert "helios serve: error: --max-active: 100000 is outside the prepared range" in err, err
    (spawn,) = spawned
    assert spawn.process.exitcode == -signal.SIGKILL


def test_an_engine_process_startup_error_keeps_its_family_and_exit_code():
    """A typed error whose class does not pickle crosses as the nearest family class that does."""
    from helios.abi.registry import ProgramOpError
    from helios.contract.settings import StartupOptionError
    from helios.errors import ExecutionError, LoadError
    from helios.server.engine_process import _portable

    refused = _portable(StartupOptionError("startup.max_concurrency", "too many"))
    assert type(refused) is StartupOptionError and refused.path == "startup.max_concurrency" and refused.exit_code == 2
    missing = _portable(ProgramOpError("helios::attend", "not registered"))
    assert type(missing) is LoadError and str(missing) == "helios::attend: not registered"
    fault = _portable(RuntimeError("can't start new thread"))
    assert type(fault) is ExecutionError and "RuntimeError: can't start new thread" in str(fault)



# `--cpu-kernels off`: the load skips building (or loading from Inductor's cache) the C++ CPU kernels, seconds of
# CPU; what is checked here does not depend on them, and test_server's server loads them as `helios serve` does
# by default. (The SIGHUP test keeps them: the stream it reads during the drain must end within it.)
NO_KERNELS = ("--cpu-kernels", "off")


def child_pids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


@pytest.fixture(scope="module")
def serving(core, tmp_path_factory):
    """One `helios serve` for the tests that leave it serving, then the one that stops it (each
    test's state: a fresh server's, as none of them holds a request past its end): one request
    generating at a time, so that the second SIGINT finds streams running."""
    server = ServerProcess(core, "--max-active", "1", "--queue-capacity", "16", *NO_KERNELS,
                           log=tmp_path_factory.mktemp("serving") / "server.log")
    yield server
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait()


def test_sigusr1_to_the_engine_process_dumps_its_stacks_and_it_keeps_serving(serving):
    """Before: SIGUSR1 (the stack-dump signal of `helios serve`) ended the engine process, and the
    server with it (exit 9), when it reached the model worker, as `kill -USR1 -PGID` does.
    test_a_second_sigint_ends_running_streams... then stops this server: a clean stop after the dump."""
    os.kill(engine_pid_of(serving), signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while "in _engine_main" not in serving.log.read_text():  # the dump is written
        assert serving.process.poll() is None and time.monotonic() < deadline, serving.log.read_text()
        time.sleep(0.05)
    body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    response = httpx.post(serving.url + "/v1/chat/completions", json=body, timeout=30)
    log = serving.log.read_text()
    assert response.status_code == 200 and serving.process.poll() is None, log
    assert "model worker died" not in log and "Traceback" not in log, log


def test_a_second_sigint_ends_running_streams_with_an_error_event_and_still_stops_the_model(serving):
    """Before: uvicorn's forced exit skipped the app's shutdown: open streams were cut without an
    error event and the log showed KeyboardInterrupt and CancelledError tracebacks. (The module's
    server, after the SIGUSR1 test: this stops it.)"""
    server = serving
    children = child_pids(server.process.pid)
    events = [threading.Event() for _ in range(12)]
    with ThreadPoolExecutor(len(events)) as pool:
        futures = [pool.submit(read_stream, server.url, started) for started in events]
        for started in events:
            assert started.wait(30)
        server.process.send_signal(signal.SIGINT)
        time.sleep(0.3)
        server.process.send_signal(signal.SIGINT)
        texts = [future.result(timeout=30) for future in futures]
    server.process.wait(30)
    code, log = server.terminate()
    assert code == 130 and "Traceback" not in log and "second interrupt" in log, log[-3000:]
    for text in texts:
        assert text.rstrip().endswith("data: [DONE]") or (text.count("event: error") == 1
                                                        and "server shutting down" in text), text[-300:]
    assert any("event: error" in text for text in texts)
    assert "Application shutdown complete" in log and all(wait_gone(pid, 10) for pid in children)


class Loaded(Exception):
    """Raised where `helios generate` would load the model (the test saw what it needed)."""


@pytest.fixture
def generate_without_load(monkeypatch):
    from helios.cli import generate_cmd

    def load(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(generate_cmd, "build_runtime", load)


def test_generate_takes_a_prompt_too_long_for_a_file_name_as_a_prompt(monkeypatch):
    """Before: the first positional was checked as a core path first, and a long prompt failed
    with "error: File name too long" (exit 1). Stopped where the model is opened (the embedded
    one, as no core is named), which follows the split of the core from the prompts."""
    from helios.cli import generate_cmd
    from helios.cli.main import main

    opened = []

    def open_model(args):
        opened.append((args.core, args.prompts))
        raise Loaded

    monkeypatch.setattr(generate_cmd, "_open", open_model)
    prompt = "word " * 100  # 500 characters: past NAME_MAX
    with pytest.raises(Loaded):
        main(["generate", prompt, "--max-tokens", "2"])
    assert opened == [(None, [prompt])]


@pytest.mark.parametrize("option, value, message", [
    ("--temperature", "nan", "--temperature must be in [0, 2]"),
    ("--temperature", "-1", "--temperature must be in [0, 2]"),
    ("--top-p", "0", "--top-p must be in (0, 1]"),
    ("--top-p", "2", "--top-p must be in (0, 1]"),
    ("--top-k", "-1", "--top-k must not be negative"),
])
def test_generate_refuses_sampling_values_the_server_refuses(option, value, message, generate_without_load, capsys):
    """Before: accepted silently (a negative or nan temperature sampled greedily, top-p 2 had no effect)."""
    from helios.cli.main import main

    assert main(["generate", option, value, "hi"]) == 2
    assert message in capsys.readouterr().err


def test_generate_into_a_closed_pipe_exits_quietly(core, monkeypatch, capsys):
    """Before: `helios generate ... | head -c1` printed "helios generate: error: Broken pipe" (exit 1).
    In this process (a subprocess would pay the imports of torch and helios again): standard output is a
    pipe whose reader is gone before the first line, and the flush a process makes at its exit must
    then find nowhere to fail (test_cli_inputs runs a real process into a closed pipe)."""
    from helios.cli.main import main

    read, write = os.pipe()
    os.close(read)
    stdout = open(write, "w")
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        code = main(["generate", str(core.path), "hello", "--accept", core.namespace, "--trust", str(core.public_key),
                     "--max-tokens", "2", "--cpu-kernels", "off"])
        stdout.flush()  # the exit's flush: before, a second BrokenPipeError ("Exception ignored", exit 120)
    finally:
        stdout.close()
    err = capsys.readouterr().err
    assert code == 141 and "Traceback" not in err and "error" not in err, err


def engine_pid_of(server: ServerProcess) -> int:
    for pid in child_pids(server.process.pid):
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"spawn_main" in cmdline.read():
                return pid
    raise AssertionError("no engine process")


def post_chat(url: str) -> httpx.Response:
    body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 220}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def test_a_killed_engine_process_ends_running_streams_and_the_server_names_the_cause(core, tmp_path):
    """Streams end with one error event, a JSON request it held gets 500, the server exits 9; before,
    neither the log nor the exit line said how the worker died (here: killed by SIGKILL), and the
    access log counted the requests it ended as prompt_tokens=0 completion_tokens=0 even when tokens
    had been streamed."""
    server = ServerProcess(core, "--max-active", "1", "--queue-capacity", "8", *NO_KERNELS,
                           log=tmp_path / "server.log")
    children = child_pids(server.process.pid)
    events = [threading.Event() for _ in range(6)]
    with ThreadPoolExecutor(len(events) + 1) as pool:
        futures = [pool.submit(read_stream, server.url, started) for started in events]
        for started in events:
            assert started.wait(30)
        held = pool.submit(post_chat, server.url)
        deadline = time.monotonic() + 30
        while metric(server.url, "helios_admission_permits_in_use") < len(events) + 1:  # the JSON request admitted
            assert time.monotonic() < deadline and not held.done(), "the JSON request was never admitted"
            time.sleep(0.05)
        time.sleep(0.2)  # the JSON request is held too
        os.kill(engine_pid_of(server), signal.SIGKILL)
        texts = [future.result(timeout=15) for future in futures]
        answer = held.result(timeout=15)
    assert server.process.wait(15) == 9
    code, log = server.terminate()
    assert answer.status_code == 500 and "the model worker died" in answer.json()["error"]["message"], answer.text
    ended = [line for line in log.splitlines() if "access:" in line and "finish=error" in line]
    assert len(ended) == 1 + sum("event: error" in text for text in texts), ended
    assert all("prompt_tokens=0 " not in line for line in ended), ended
    assert any("completion_tokens=0 " not in line for line in ended), ended  # the one generating
    for text in texts:
        assert text.rstrip().endswith("data: [DONE]") or (text.count("event: error") == 1
                                                        and "the model worker died" in text), text[-300:]
    assert any("event: error" in text for text in texts)
    assert "the model worker died (the engine process was killed by SIGKILL)" in log and "Traceback" not in log, log
    assert "helios serve: error: the model worker died (the engine process was killed by SIGKILL)" in log
    assert all(wait_gone(pid, 10) for pid in children)


def test_sigterm_while_the_embedded_model_is_first_prepared_leaves_no_scratch_behind(tmp_path):
    """Before: SIGTERM ended the process at once, leaving a hidden `.preparing-*` scratch directory
    (a partial core) in the cache on every interrupted first start. The engine process started ahead
    of the preparation, not yet ordered to load, is killed before the serving process ends (not
    left to notice it is gone)."""
    cache = tmp_path / "cache"
    env = dict(os.environ, HELIOS_CACHE=str(cache))
    log = tmp_path / "server.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "helios.cli.main", "serve", "--port", "0"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        while not list(cache.glob("embedded/.preparing-*")):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(1)  # into the preparation
        children = [int(pid) for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()]
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not list(cache.glob("embedded/.preparing-*")), sorted(cache.rglob("*"))
    assert children and all(wait_gone(pid, 10) for pid in children), children
    text = log.read_text()
    assert "helios serve: stopped by SIGTERM while starting" in text and "the serving process is gone" not in text, text


@pytest.mark.parametrize("signum, raised", [(signal.SIGTERM, OSError), (signal.SIGINT, KeyboardInterrupt)])
def test_a_stop_signal_whose_unwinding_turns_into_another_error_still_stops_the_start(monkeypatch, capsys, signum,
                                                                                     raised):
    """Before: a SIGTERM while the embedded model was first prepared could end the process with exit
    1 (once in CI): its unwinding turned into another error on the way out (a cleanup failing, native
    code wrapping it), which `main` reported as a failure rather than the stop it is."""
    from helios.cli import serve_run

    signalled = []
    monkeypatch.setattr(signal, "raise_signal", signalled.append)

    def opening(args):
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)
        finally:
            raise OSError("the scratch directory could not be removed")

    monkeypatch.setattr(serve_run, "_open", opening)
    with pytest.raises(raised):
        serve_run._start(None, None, None, 0.0)
    if signum == signal.SIGTERM:
        assert signalled == [signal.SIGTERM]
        assert "helios serve: stopped by SIGTERM while starting" in capsys.readouterr().err
    else:
        assert signalled == []


SMALL_SEND_BUFFER_DRIVER = """
import socket, sys

from helios.cli import serve_run

_bind = serve_run.bind


def bind(host, port):
    sock = _bind(host, port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # inherited by every connection it accepts
    return sock


serve_run.bind = bind

if __name__ == "__main__":
    from helios.cli.main import main

    sys.exit(main())
"""


class SmallSendBufferServer(ServerProcess):
    """`helios serve CORE --port 0 ...` whose connections have a send buffer of a few KiB (the listening socket's,
    set by a driver around `bind`): a reader that stops reading pauses the server's writes after about 80 KiB
    (the kernel's buffers, then the transport's 64 KiB high-water mark) rather than the several MiB that the
    loopback's autotuned send buffer holds."""

    def __init__(self, core, tmp_path: Path, *options: str, log: Path):
        driver = tmp_path / "small_send_buffer_driver.py"
        driver.write_text(SMALL_SEND_BUFFER_DRIVER)
        command = [sys.executable, str(driver), "serve", str(core.path), "--accept", core.namespace,
                   "--trust", str(core.public_key), "--port", "0", "--log-level", "info", *options]
        self.log = log
        with open(log, "w") as stderr:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.url = self._read_url()
        self._wait_healthy()


def paused_reader(url: str, body: dict) -> socket.socket:
    """A connection that sends `body` as a streamed chat request, then reads nothing: a small
    receive buffer, so that the server's writes soon wait for it."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def test_sighup_drains_like_sigterm_and_drops_readers_paused_after_their_generation_finished_quietly(core, tmp_path):
    """Before: SIGHUP (a closed terminal) ended the server at once, cutting every response; and
    uvicorn cancelled the responses of readers that stopped reading at its own deadline and logged
    "Cancel 2 running task(s)" and "ASGI callable returned without completing response" twice, all
    at ERROR level. SIGHUP takes SIGTERM's shutdown (its drain, then the drop), so one server checks
    both: a stream in flight completes, the paused readers are dropped quietly after the drain."""
    # the default drain: the serving process may still be forwarding the finished generation's events when the
    # signal comes, and the drop's responses must end within uvicorn's backstop after it. The engine runs in the
    # serving process: the drain and the drop are uvicorn's there whichever process runs the engine (the module's
    # other servers run the default engine process), and the events of the 1,000 tokens with 20 alternatives
    # each then need no pickling across its pipe, nor the engine process's imports and load. Its connections' small
    # send buffers pause a reader after about 80 KiB; each reader's response here is several times that (8 x 64
    # tokens with 20 alternatives each, about 1.3 KiB a token), generated while it reads nothing.
    server = SmallSendBufferServer(core, tmp_path, "--no-engine-process", log=tmp_path / "server.log")
    body = {"model": SERVED_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 64, "n": 8,
            "temperature": 0, "stream": True, "logprobs": True, "top_logprobs": 20}
    readers = [paused_reader(server.url, body) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        for reader in readers:  # each response started
            while not reader.recv(1, socket.MSG_PEEK):
                assert time.monotonic() < deadline
        while metric(server.url, "helios_generated_tokens_total") < 2 * 8 * 64:
            assert time.monotonic() < deadline, "generation never finished"
            time.sleep(0.1)
        started = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(read_stream, server.url, started, 150)
            assert started.wait(30)
            server.process.send_signal(signal.SIGHUP)
            text = future.result(timeout=30)
        server.process.wait(30)
        code, log = server.terminate()
    finally:
        for reader in readers:
            reader.close()
    assert text.rstrip().endswith("data: [DONE]"), text[-300:]
    errors = [line for line in log.splitlines() if line.startswith(("ERROR", "CRITICAL"))]
    assert code == -signal.SIGHUP and not errors and "Traceback" not in log, log[-3000:]
    assert "dropped 2 connection(s) still open after the drain" in log, log[-3000:]
    assert "helios serve: shut down" in log and "Application shutdown complete" in log, log[-3000:]
