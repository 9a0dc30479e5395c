"""tools/measure_suite.py: where the suite's time goes, summed per test file and notebook."""

import sys

from course_utils import config

sys.path.insert(0, str(config.REPO_ROOT / "tools"))
try:
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
