import subprocess
import sys

from course_utils.kit.cli import main


def test_env_command_prints_the_report(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "inductor c++" in out


def test_data_verify_command(capsys):
    assert main(["data", "verify"]) == 0
    assert "ok    data/tiny_corpus.txt" in capsys.readouterr().out


def test_data_verify_reports_a_missing_file(monkeypatch, tmp_path, capsys):
    (tmp_path / "SHA256SUMS").write_text("0" * 64 + "  tiny_corpus.txt\n")
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    assert main(["data", "verify"]) == 1
    assert "data/tiny_corpus.txt: is missing" in capsys.readouterr().err


def test_fast_doctor_as_a_module():
    out = subprocess.run([sys.executable, "-m", "course_utils", "doctor", "--fast"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "All" in out.stdout and "checks passed" in out.stdout


def test_unknown_command_is_a_usage_error():
    out = subprocess.run([sys.executable, "-m", "course_utils", "frobnicate"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "invalid choice" in out.stderr
