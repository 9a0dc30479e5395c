"""Issue 16, "one home for each idea": each idea below lives in one module, every user calls it, and
no second copy can come back unnoticed.

Two kinds of test: a scan of the source (an idea's telltale code may stand only in its home, plus
named exceptions with their reason), and agreement tests (the old copies' users give what the
home gives, on inputs where the old copies differed).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import random
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from course_utils import config, exercises
from course_utils.deploy import aoti_cpp
from course_utils.exercises import nb10
from course_utils import toolchain
from course_utils.kit import offline
from course_utils.models import checkpoint
from course_utils.serving.extras import bare
from course_utils.serving.server import engine
from course_utils.serving.server.percentile import nearest_rank
from course_utils.serving.server.runner import free_port
from course_utils.serving.server.sse import END, ERROR, TOKEN, format_event, token_event
from notebook_files import import_written, written_module

ROOT = config.REPO_ROOT
PACKAGE = ROOT / "course_utils"
#: the notebooks' paired sources (course_utils.kit.sources): notebook code is scanned as code
NOTEBOOKS = ROOT / "notebooks" / "src"


# ---- the source scan --------------------------------------------------------------------------

def python_files(*folders: Path) -> Iterator[Path]:
    for folder in folders:
        yield from sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def docstring_nodes(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (prose may mention anything)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def strings(tree: ast.Module) -> Iterator[ast.Constant]:
    skip = docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in skip:
            yield node


def text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def starts_an_sse_line(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("data: ", "event: "))


def writes_sse(tree: ast.Module) -> bool:
    """Text that starts an SSE ``data:`` or ``event:`` line put together by code: an f-string
    part, or the left side of ``+`` or ``%``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and any(
                isinstance(part, ast.Constant) and (starts_an_sse_line(part.value) or "\ndata: " in str(part.value)
                                                    or "\nevent: " in str(part.value) or "}data: " in str(part.value))
                for part in node.values):
            return True
        if (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod))
                and isinstance(node.left, ast.Constant) and starts_an_sse_line(node.left.value)):
            return True
    return False


def reads_sse(tree: ast.Module) -> bool:
    """A ``.startswith("data:")`` / ``("event:")`` test: a line parser of SSE."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
               and any(isinstance(a, ast.Constant) and text(a.value).startswith(("data:", "event:")) for a in node.args)
               for node in ast.walk(tree))


def computes_percentiles(tree: ast.Module) -> bool:
    """``statistics.quantiles``/``numpy.percentile``-style calls, or a rank ``ceil(...)`` over 100 or
    of 0.99 (a hand-made percentile)."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        if name in ("quantiles", "percentile", "nanpercentile"):
            return True
        if name == "ceil" and any(isinstance(c, ast.Constant) and c.value in (100, 0.99, 0.95)
                                  for arg in node.args for c in ast.walk(arg)):
            return True
    return False


def names_a_compiler(tree: ast.Module) -> bool:
    """A string that is exactly a compiler, a launcher, or the CXX variable."""
    return any(node.value in ("g++", "c++", "clang++", "ccache", "CXX") for node in strings(tree))


def finds_a_free_port(tree: ast.Module) -> bool:
    """A function that binds port 0 and returns the port it got."""
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        binds_zero = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "bind"
                         and n.args and isinstance(n.args[0], ast.Tuple) and isinstance(n.args[0].elts[-1], ast.Constant)
                         and n.args[0].elts[-1].value == 0 for n in ast.walk(fn))
        returns_port = any(isinstance(n, ast.Return) and n.value is not None and "getsockname" in ast.unparse(n.value)
                           for n in ast.walk(fn))
        if binds_zero and returns_port:
            return True
    return False


def finds_the_repo_root(tree: ast.Module) -> bool:
    """A path computed from ``__file__`` (the repository root, or a folder found from it)."""
    return any(isinstance(node, ast.Name) and node.id == "__file__" for node in ast.walk(tree))


def reads_pythonpath(tree: ast.Module) -> bool:
    """``....get("PYTHONPATH")`` or ``environ["PYTHONPATH"]`` read: building a child's PYTHONPATH."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "PYTHONPATH"):
            return True
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and isinstance(node.slice, ast.Constant) and node.slice.value == "PYTHONPATH"):
            return True
    return False


def spells_the_checkpoint_format(tree: ast.Module) -> bool:
    return any(text(node.value).startswith("course_utils.tiny_gpt/") for node in strings(tree))


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


#: idea: (what gives a copy away, the folders scanned, {file allowed to hold it: why}).
HOMES: dict[str, tuple[Callable[[ast.Module], bool], tuple[Path, ...], dict[str, str]]] = {
    "SSE writer": (writes_sse, (PACKAGE, ROOT / "tools", NOTEBOOKS), {
        "course_utils/serving/server/sse.py": "the home",
        "notebooks/src/10_serving.py": "step 4's hand-written batching app streams its events by hand: writing the format "
                                       "is the lesson of step 5 (the course server's format, read back by the home's parser)"}),
    "SSE parser": (reads_sse, (PACKAGE, ROOT / "tools", NOTEBOOKS), {
        "course_utils/serving/server/sse.py": "the home",
        "course_utils/exercises/nb10.py": "exercise 10.parse_sse: the self-contained reference solution a "
                                          "learner is shown, and the mistakes it teaches (checked against the home)"}),
    "percentile": (computes_percentiles, (PACKAGE, ROOT / "tools", NOTEBOOKS), {
        "course_utils/serving/server/percentile.py": "the home (nearest rank)",
        "course_utils/exercises/nb10.py": "exercise 10.p99: the reference solution and its mistakes (checked "
                                          "against the home)",
        "course_utils/bench.py": "the median and IQR of timing samples, a different statistic"}),
    "C++ compiler choice": (names_a_compiler, (PACKAGE, ROOT / "tools", NOTEBOOKS), {"course_utils/toolchain.py": "the home"}),
    "free port": (finds_a_free_port, (PACKAGE, ROOT / "tools", ROOT / "tests", NOTEBOOKS),
                  {"course_utils/serving/server/runner.py": "the home"}),
    "repository root": (finds_the_repo_root, (PACKAGE, NOTEBOOKS), {
        "course_utils/config.py": "the home (REPO_ROOT)",
        "notebooks/src/10_serving.py": "its litserve_app.py starts itself: __file__ is that script, not the root",
        "notebooks/src/13_serving_engine.py": "its ray_app.py hands its own folder to Ray's workers, not the root"}),
    "child PYTHONPATH": (reads_pythonpath, (PACKAGE, ROOT / "tools", NOTEBOOKS), {"course_utils/config.py": "the home"}),
    "checkpoint format": (spells_the_checkpoint_format, (PACKAGE, ROOT / "tools", NOTEBOOKS),
                          {"course_utils/models/checkpoint.py": "the home (FORMAT)"}),
}


@pytest.fixture(scope="module")
def trees() -> dict[Path, ast.Module]:
    folders = {folder for _, scanned, _ in HOMES.values() for folder in scanned}
    return {path: parsed(path) for path in python_files(*sorted(folders))}


@pytest.mark.parametrize("idea", list(HOMES))
def test_each_idea_is_written_only_in_its_home(idea, trees):
    found, scanned, allowed = HOMES[idea]
    where = {rel(path) for path, tree in trees.items()
             if any(path.is_relative_to(folder) for folder in scanned) and found(tree)}
    assert where - set(allowed) == set(), f"a copy of the {idea} outside its home: {sorted(where - set(allowed))}"
    assert next(iter(allowed)) in where, f"the {idea}'s home no longer holds it: the scan's signature is stale"


def test_the_scan_recognises_each_old_copy():
    """Each signature, on code shaped like the copy it replaced (so a copy that comes back is seen)."""
    old = {
        "SSE writer": 'def _sse(event, payload):\n    return f"{head}data: {json.dumps(payload)}\\n\\n"\n',
        "SSE writer, by +": 'line = "data: " + json.dumps(payload) + "\\n\\n"\n',
        "SSE parser": 'def feed(line):\n    if line.startswith("event:"):\n        pass\n',
        "percentile": "cuts = statistics.quantiles(values, n=100, method='inclusive')\n",
        "percentile, by hand": "p95 = ordered[math.ceil(0.95 * len(ordered)) - 1]\n",
        "C++ compiler choice": 'candidates = [os.environ["CXX"]] + ["g++", "c++", "clang++"]\n',
        "free port": "def free_port():\n    with socket.socket() as s:\n        s.bind(('127.0.0.1', 0))\n"
                     "        return s.getsockname()[1]\n",
        "repository root": "root = Path(__file__).resolve().parents[2]\n",
        "child PYTHONPATH": 'env = {"PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH")])}\n',
        "checkpoint format": 'ckpt = {"format": "course_utils.tiny_gpt/1"}\n',
    }
    assert {idea.split(",")[0] for idea in old} == set(HOMES)
    for idea, code in old.items():
        assert HOMES[idea.split(",")[0]][0](ast.parse(code)), idea
    assert not writes_sse(ast.parse('raise RuntimeError(f"error event: {value}")'))


# ---- 1. server-sent events -----------------------------------------------------------------------

def random_stream(rng: random.Random) -> str:
    alphabet = ["a", " ", "\n", "data: x", "event: end", '"', "\u00e9", "\U0001f600", ":"]
    tokens = [rng.choice(alphabet) for _ in range(rng.randint(0, 8))]
    text = "".join(token_event(t, i) for i, t in enumerate(tokens))
    if rng.random() < 0.3:
        text += format_event({"detail": "server is stopping", "status": 503}, ERROR)
    if rng.random() < 0.7:
        text += format_event({"reason": "length", "tokens": len(tokens)}, END)
    return text


def test_the_exercise_reference_parser_agrees_with_the_course_parser():
    rng = random.Random(16)
    streams = [args[0] for args in nb10._sse_cases()] + [random_stream(rng) for _ in range(300)]
    for stream in streams:
        assert nb10.parse_sse(stream) == nb10.course_parse_sse(stream), stream


def test_the_parse_sse_checker_expects_what_the_course_parser_reads():
    assert exercises.check("10.parse_sse", nb10.course_parse_sse, strict=True).correct
    ex = exercises.get("10.parse_sse")
    assert exercises.check("10.parse_sse", ex.solution(), strict=True).correct


class ScriptedSSE(BaseHTTPRequestHandler):
    """Answers every POST with the bytes in ``body`` as an event stream."""

    body = b""

    def do_POST(self) -> None:  # noqa: N802 (the handler's API)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted_server() -> Iterator[Callable[[str], str]]:
    """Return ``serve(stream_text) -> url``: a loopback server that streams that text to every POST."""
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), ScriptedSSE)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def serve(stream: str) -> str:
        ScriptedSSE.body = stream.encode("utf-8")
        return f"http://127.0.0.1:{server.server_address[1]}"

    try:
        yield serve
    finally:
        server.shutdown()
        server.server_close()


def test_the_demo_and_the_load_generator_read_streams_with_the_course_parser(scripted_server, tmp_path):
    pytest.importorskip("gradio")
    from course_utils.serving.server.loadgen import run_load

    stream_generate = import_written("10_serving.ipynb", "APPS", "demo_page", tmp_path).stream_generate

    good = "".join(token_event(t, i) for i, t in enumerate(["He", "l", "lo"])) + format_event({"tokens": 3}, END)
    url = scripted_server(good)
    assert list(stream_generate(url, "x", 3)) == ["He", "Hel", "Hello"]
    assert run_load(url, concurrency=2, n_requests=4, max_new_tokens=3).n_ok == 4
    # Out of order: the old demo parser (no index check) showed "Hlo"; the course parser refuses it.
    skipped = token_event("H", 0) + token_event("lo", 2) + format_event({"tokens": 2}, END)
    url = scripted_server(skipped)
    updates = list(stream_generate(url, "x", 2))
    assert "[error] MalformedStream: token event out of order" in updates[-1] and "Hlo" not in updates[-1]
    report = run_load(url, concurrency=1, n_requests=2, max_new_tokens=2)
    assert report.n_malformed == 2 and "out of order" in report.errors[0]
    # CRLF line ends are SSE too; the old demo parser never saw a blank line in them.
    crlf = good.replace("\n", "\r\n")
    assert list(stream_generate(scripted_server(crlf), "x", 3))[-1] == "Hello"
    assert run_load(scripted_server(crlf), concurrency=1, n_requests=1, max_new_tokens=3).n_ok == 1


def test_the_servers_write_with_the_shared_formatter():
    from course_utils.serving.server import app

    assert app.token_event is token_event and app.format_event is format_event
    pytest.importorskip("litserve", reason="litserve is not installed")
    litserve_app = written_module("10_serving.ipynb", "APPS", "litserve_app")
    assert litserve_app.token_event is token_event and litserve_app.format_event is format_event
    assert TOKEN == "token"


# ---- 2. percentiles ----------------------------------------------------------------------------

def test_the_exercise_p99_is_the_course_percentile():
    rng = random.Random(99)
    for n in [*range(1, 30), 99, 100, 101, 199, 200, 201, 1000, 1001]:
        values = [round(rng.lognormvariate(3, 1), 3) for _ in range(n)]
        assert nb10.p99(values) == nearest_rank(values, 99), n


def test_the_p99_checker_accepts_the_course_definition_and_refuses_interpolation():
    import statistics

    assert exercises.check("10.p99", lambda lat: nearest_rank(lat, 99), strict=True).correct

    def interpolated(lat):
        return statistics.quantiles(lat, n=100, method="inclusive")[98] if len(lat) > 1 else lat[0]

    assert not exercises.check("10.p99", interpolated, strict=True).correct


def test_the_load_report_uses_the_course_percentile():
    from course_utils.serving.server import loadgen, percentile

    assert loadgen.percentiles is percentile.percentiles


# ---- 3. the C++ compiler -----------------------------------------------------------------------

@pytest.fixture
def ccache_on_path(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A fake ``ccache`` first on PATH that logs its arguments and runs them; returns (script, log)."""
    if shutil.which("g++") is None:
        pytest.skip("no g++ here")
    folder, log = tmp_path / "bin", tmp_path / "ccache.log"
    folder.mkdir()
    script = folder / "ccache"
    script.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(log))}\nexec "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CXX", "ccache g++")
    return script, log


def test_doctor_and_loader_build_agree_on_a_compiler_with_a_launcher(ccache_on_path):
    script, log = ccache_on_path
    command = toolchain.cxx_command()
    assert command == [str(script), shutil.which("g++")]
    tc = toolchain.check_toolchain()
    assert tc.works and tc.compiler == shlex.join(command), tc.detail
    assert log.read_text().strip(), "the doctor's probe went through the launcher"
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed here")
    assert aoti_cpp.toolchain_problem() is None  # it used to look for a program called "ccache g++"
    cxx = aoti_cpp.find_tools()["cxx"]
    assert cxx == tc.compiler
    assert aoti_cpp.cmake_compiler_args(cxx) == [f"-DCMAKE_CXX_COMPILER_LAUNCHER={script}",
                                                 f"-DCMAKE_CXX_COMPILER={shutil.which('g++')}"]


def test_cmake_builds_through_the_launcher_with_those_arguments(ccache_on_path, tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed here")
    script, log = ccache_on_path
    source = tmp_path / "src"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.18)\nproject(probe CXX)\n"
                                           "add_executable(probe main.cpp)\n")
    (source / "main.cpp").write_text("int main() { return 0; }\n")
    build = tmp_path / "build"
    args = aoti_cpp.cmake_compiler_args(aoti_cpp.find_tools()["cxx"])
    args += ["-G", "Ninja"] if shutil.which("ninja") else []
    for cmd in (["cmake", "-S", str(source), "-B", str(build), *args], ["cmake", "--build", str(build)]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
    assert "main.cpp" in log.read_text(), "CMake compiled without the launcher"


@pytest.mark.parametrize("cxx", ["no-such-compiler++", "ccache-missing-launcher g++", "", "g++ 'unclosed"])
def test_doctor_and_loader_build_both_refuse_an_unusable_cxx(cxx, monkeypatch):
    monkeypatch.setenv("CXX", cxx)
    tc = toolchain.check_toolchain()
    assert not tc.works and tc.compiler is None and "no C++ compiler" in tc.detail
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed here")
    problem = aoti_cpp.toolchain_problem()
    assert problem is not None and tc.detail in problem  # the same reason, plus how to install one


def test_cmake_arguments_of_plain_and_flagged_compilers():
    assert aoti_cpp.cmake_compiler_args("/usr/bin/g++") == ["-DCMAKE_CXX_COMPILER=/usr/bin/g++"]
    assert aoti_cpp.cmake_compiler_args("sccache clang++ -m64 '-DX=a b'") == [
        "-DCMAKE_CXX_COMPILER_LAUNCHER=sccache", "-DCMAKE_CXX_COMPILER=clang++", "-DCMAKE_CXX_FLAGS=-m64 '-DX=a b'"]
    with pytest.raises(toolchain.CompilerNotFound, match="only a launcher"):
        aoti_cpp.cmake_compiler_args("ccache")


# ---- 5. the repository root and the PYTHONPATH of child processes --------------------------------

def test_child_pythonpath_puts_its_folders_then_the_repo_first_each_once():
    sep = os.pathsep
    got = config.child_pythonpath("/first", environ={"PYTHONPATH": f"/b{sep}{sep}/first{sep}{ROOT}"})
    assert got.split(sep) == ["/first", str(ROOT), "/b"]
    assert config.child_pythonpath(environ={}) == str(ROOT)
    assert config.child_pythonpath(environ={"PYTHONPATH": got}).split(sep) == [str(ROOT), "/first", "/b"]
    with pytest.raises(ValueError, match="cannot contain"):
        config.child_pythonpath(f"/a{sep}/b")


def test_every_child_process_gets_the_shared_pythonpath(monkeypatch):
    from course_utils.serving.server.process import serve_in_subprocess

    monkeypatch.setenv("PYTHONPATH", f"/elsewhere{os.pathsep}{ROOT}")
    assert offline.child_env()["PYTHONPATH"] == config.child_pythonpath(offline.SITE_DIR)
    assert offline.SITE_DIR == ROOT / "tools" / "offline" and (offline.SITE_DIR / "sitecustomize.py").is_file()
    proc = serve_in_subprocess({"embed": False})
    try:
        assert proc.env["PYTHONPATH"] == config.child_pythonpath()
    finally:
        proc.close()
    pytest.importorskip("litserve", reason="litserve is not installed")
    litserve_app = written_module("10_serving.ipynb", "APPS", "litserve_app")
    proc = litserve_app.litserve_process()
    try:
        assert proc.env["PYTHONPATH"] == config.child_pythonpath() and Path(proc.cwd) == ROOT
    finally:
        proc.close()


# ---- 6. the checkpoint format: the trainer writes what the loader reads --------------------------

def test_the_trainer_writes_a_checkpoint_the_loader_reads(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("train_tiny_gpt", ROOT / "tools" / "train_tiny_gpt.py")
    trainer = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repository on sys.path
    spec.loader.exec_module(trainer)
    assert trainer.FORMAT is checkpoint.FORMAT
    out = tmp_path / "tiny.pt"
    old_threads = torch.get_num_threads()
    try:
        assert trainer.main(["--steps", "1", "--batch-size", "2", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(old_threads)
    model, tok = checkpoint.load_tiny_gpt(out)
    assert torch.load(out, weights_only=True)["format"] == checkpoint.FORMAT
    assert tok.vocab_size == model.config.vocab_size


# ---- 7. the bare decoding rate is timed by course_utils.bench ------------------------------------

def test_bare_decoding_is_timed_by_bench_first_call(monkeypatch):
    from course_utils import bench
    from course_utils.models.gpt import GPTConfig, TinyGPT

    model = TinyGPT(GPTConfig(vocab_size=11, block_size=16, n_layer=1, n_head=1, n_embd=8)).eval()
    timed = iter([0.5, 0.1, 0.2, 0.4])  # sorted 0.1, 0.2, 0.4, 0.5: the upper median is 0.4
    calls = []

    def fake_first_call(fn, *args, **kwargs):
        fn(*args, **kwargs)
        calls.append(fn)
        return next(timed)

    monkeypatch.setattr(bench, "first_call", fake_first_call)
    rate = bare.bare_decode_tokens_per_s(model, batch_size=2, prompt_len=3, new_tokens=4, repeats=4)
    assert len(calls) == 4 and rate == pytest.approx(2 * 4 / 0.4)
    with pytest.raises(ValueError, match="repeats"):
        bare.bare_decode_tokens_per_s(model, batch_size=2, repeats=0)


# ---- 8. request limits and sampling: the LitServe app uses the engine's ----------------------------

def test_litserve_uses_the_engines_limits_check_and_sampling_seed():
    pytest.importorskip("litserve", reason="litserve is not installed")
    litserve_app = written_module("10_serving.ipynb", "APPS", "litserve_app")
    assert litserve_app.check_limits is engine.check_limits
    assert litserve_app.row_generator is engine.sampling_generator
    first, again = engine.sampling_generator(0.7, 42), engine.sampling_generator(0.7, 42)
    assert torch.equal(torch.rand(4, generator=first), torch.rand(4, generator=again))
    assert engine.sampling_generator(0.0, 42) is None
