"""The notebooks here are fixtures (executed copies read by tests/test_verdicts.py), not course
notebooks: keep nbval from collecting and executing them under ``pytest --nbval-lax``."""

collect_ignore_glob = ["*.ipynb"]
