"""tools/measure_suite.py: where the suite's time goes, summed per test file and notebook."""

import os
import sys
from pathlib import Path

from course_utils import config

sys.path.insert(0, str(config.REPO_ROOT / "tools"))
try:
    import measure_suite
    from measure_suite import per_file_seconds
finally:
    sys.path.remove(str(config.REPO_ROOT / "tools"))


def test_junit_cases_are_summed_per_test_file_and_notebook(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="notebooks.00_setup.ipynb" name="Cell 0" time="4.5"/>'
        '<testcase classname="notebooks.00_setup.ipynb" name="Cell 1" time="0.5"/>'
        '<testcase classname="tests.test_config" name="test_a" time="1.25"/>'
        '<testcase classname="tests.test_bench.TestTables" name="test_b" time="2"/>'
        '<testcase classname="tests.test_config" name="test_c" time="0.75"/>'
        "</testsuite></testsuites>")
    assert per_file_seconds(report) == {"00_setup.ipynb": 5.0, "test_config.py": 2.0, "test_bench.py": 2.0}


def test_cold_env_points_every_compile_cache_at_an_empty_folder(tmp_path):
    env = measure_suite.cold_env({"TORCHINDUCTOR_CACHE_DIR": "/warm", "TRITON_CACHE_DIR": "/warm2", "PATH": "/bin"},
                                 tmp_path / "cache")
    assert "TORCHINDUCTOR_CACHE_DIR" not in env and "TRITON_CACHE_DIR" not in env and env["PATH"] == "/bin"
    assert env["XDG_CACHE_HOME"] == str(tmp_path / "cache") and env["PIP_NO_CACHE_DIR"] == "1"
    assert env["TMPDIR"] == str(tmp_path / "cache" / "tmp")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["tmp"] and not any((tmp_path / "cache" / "tmp").iterdir())
    # the course's Inductor cache follows XDG_CACHE_HOME, so it starts empty too
    assert config.inductor_cache_dir(env) == tmp_path / "cache" / "pytorch2-course" / "inductor" / config.build_tag()


def test_calibration_times_the_same_loop_and_returns_its_median():
    seconds = measure_suite.calibration_s(repeats=3, n=100_000)
    assert 0 < seconds < 5
    assert measure_suite.calibration_s(repeats=1, n=10) < seconds  # a thousandth of the work takes less time


def test_the_headers_folder_is_inductors_own():
    from torch._inductor import codecache

    assert config.precompiled_header_dir() == Path(codecache._HEADER_DIR)


def test_a_cold_run_builds_its_precompiled_headers_in_its_own_empty_temporary_directory(tmp_path):
    """torch decides where the headers go at import, from TMPDIR: a process started with cold_env's
    environment looks for them under the empty folder, never in this user's temporary directory."""
    import subprocess

    env = measure_suite.cold_env(dict(os.environ), tmp_path / "cache")
    code = "from torch._inductor import codecache; print(codecache._HEADER_DIR)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).is_relative_to(tmp_path / "cache" / "tmp")


def test_idle_share_is_the_idle_ticks_over_all_ticks_between_two_readings():
    assert measure_suite.idle_share((100.0, 1000.0), (130.0, 1200.0)) == 30 / 200
    assert measure_suite.idle_share(None, (1.0, 2.0)) is None
    assert measure_suite.idle_share((5.0, 10.0), (5.0, 10.0)) is None  # no time between the readings
    now = measure_suite.cpu_times()
    if Path("/proc/stat").exists():
        assert now is not None and 0 <= now[0] <= now[1]
