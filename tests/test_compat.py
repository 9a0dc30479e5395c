import pytest
import torch
from torch import nn

from course_utils import compat


def test_torch_version_parses():
    major, minor = compat.torch_version()
    assert (major, minor) >= (2, 11)


def test_features_cover_every_name_and_are_booleans():
    feats = compat.features()
    assert list(feats) == list(compat.FEATURES)
    assert all(isinstance(v, bool) for v in feats.values())
    # present in every supported release (2.11 .. 2.14)
    for name in ("draft_export", "dim_auto", "while_loop", "scan", "cache_artifacts"):
        assert feats[name], name
    with pytest.raises(KeyError, match="unknown feature"):
        compat.has("warp_drive")


def test_newer_apis_agree_with_the_signature():
    import inspect

    params = inspect.signature(torch.compile).parameters
    assert compat.has("compile_recompile_limit_kwarg") == ("recompile_limit" in params)
    assert compat.has("nonstrict_trace") == hasattr(torch.compiler, "nonstrict_trace")


def test_regional_compile_probes_match_the_installed_torch():
    """The two notebook-11 probes are True exactly when the API is there (both are on 2.14)."""
    assert compat.has("nested_compile_region") == hasattr(torch.compiler, "nested_compile_region")
    assert compat.has("error_on_graph_break") == hasattr(torch._dynamo, "error_on_graph_break")
    if compat.torch_version() >= (2, 14):
        assert compat.has("nested_compile_region") and compat.has("error_on_graph_break")


def test_is_compiled_for_functions_and_modules():
    def f(x):
        return x + 1

    model = nn.Linear(2, 2)
    assert not compat.is_compiled(f) and not compat.is_compiled(model)
    assert compat.is_compiled(torch.compile(f, backend="eager"))
    assert compat.is_compiled(torch.compile(model, backend="eager"))


def test_recompile_limit_sets_and_restores():
    cfg = torch._dynamo.config
    key = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    before = getattr(cfg, key)
    with compat.recompile_limit(2):
        assert getattr(cfg, key) == 2
    assert getattr(cfg, key) == before
    with pytest.raises(ValueError):
        with compat.recompile_limit(0):
            pass


def test_recompile_limit_really_limits_recompiles():
    counts = {"compiles": 0}

    def counting_backend(gm, example_inputs):
        counts["compiles"] += 1
        return gm.forward

    @torch.compile(backend=counting_backend, dynamic=False)
    def f(x, k):
        return x * k

    with compat.recompile_limit(2):
        for k in range(5):  # each Python int constant forces a recompile
            f(torch.ones(2), k)
    assert counts["compiles"] == 2  # later calls fall back to eager


def test_nonstrict_trace_is_available_or_explains():
    def f(x):
        return x

    if compat.has("nonstrict_trace"):
        assert callable(compat.nonstrict_trace(f))
    else:
        with pytest.raises(NotImplementedError, match="allow_in_graph"):
            compat.nonstrict_trace(f)


def test_the_defaults_the_notebooks_rely_on():
    """Notebooks call torch.export.export and torch.onnx.export directly, trusting these defaults."""
    import inspect

    assert inspect.signature(torch.export.export).parameters["strict"].default is False
    assert inspect.signature(torch.onnx.export).parameters["dynamo"].default is True


def test_every_feature_probe_is_used_somewhere():
    """A probe nothing asks about is dead code; drop it from FEATURES instead."""
    from course_utils import config

    sources = [p.read_text(encoding="utf-8") for p in (config.REPO_ROOT / "notebooks").glob("*.ipynb")]
    sources += [p.read_text(encoding="utf-8") for p in (config.REPO_ROOT / "course_utils").rglob("*.py")
                if p.name != "compat.py"]
    text = "\n".join(sources).replace('\\"', '"')
    unused = [name for name in compat.FEATURES
              if f'has("{name}")' not in text and f"has('{name}')" not in text]
    assert not unused, f"no notebook or helper asks compat.has() about {unused}"


def test_run_and_get_code_returns_the_result_and_the_sources():
    def f(x):
        return torch.relu(x) + 1

    x = torch.randn(4)
    out, sources = compat.run_and_get_code(torch.compile(f), x)
    torch.testing.assert_close(out, f(x))
    assert isinstance(sources, list) and len(sources) == 1 and "async_compile" in sources[0]
