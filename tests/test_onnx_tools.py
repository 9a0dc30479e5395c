"""MiniLM exported to ONNX: names, dynamic shapes, reuse, sessions, and parity with eager."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from course_utils.deploy import onnx_tools  # noqa: E402
from course_utils.models import minilm  # noqa: E402


@pytest.fixture(scope="module")
def mini() -> minilm.MiniLM:
    return minilm.load_minilm()


@pytest.fixture(scope="module")
def exported(mini, tmp_path_factory):
    """One export shared by the module's tests (it takes several seconds)."""
    path = tmp_path_factory.mktemp("onnx") / "minilm.onnx"
    return onnx_tools.export_minilm(path, mini=mini)


def _identity_model(path, name: str = "x") -> None:
    from onnx import TensorProto, helper

    inp = helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n"])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    graph = helper.make_graph([helper.make_node("Identity", [name], ["y"])], "g", [inp], [out])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_default_path_is_in_the_build_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path))
    assert onnx_tools.default_path() == tmp_path / "onnx" / "minilm.onnx"


def test_export_has_the_agreed_names_and_dynamic_axes(exported):
    model = onnx.load(str(exported))
    onnx.checker.check_model(model)
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in model.graph.output] == ["embedding"]
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        assert [d.dim_param for d in dims] == ["batch", "seq"]
        assert inp.type.tensor_type.elem_type == onnx.TensorProto.INT64


def test_a_second_export_reuses_the_up_to_date_file(exported, mini):
    before = exported.stat().st_mtime_ns
    assert onnx_tools.is_up_to_date(exported)
    assert onnx_tools.export_minilm(exported, mini=mini) == exported
    assert exported.stat().st_mtime_ns == before


def test_a_changed_file_or_other_opset_is_not_up_to_date(tmp_path, exported):
    copy = tmp_path / "minilm.onnx"
    copy.write_bytes(exported.read_bytes())
    onnx_tools._stamp_path(copy).write_text(onnx_tools._stamp_path(exported).read_text())
    assert onnx_tools.is_up_to_date(copy)
    assert not onnx_tools.is_up_to_date(copy, opset=17)
    with copy.open("ab") as fh:
        fh.write(b"\0")
    assert not onnx_tools.is_up_to_date(copy)
    assert not onnx_tools.is_up_to_date(tmp_path / "absent.onnx")


def test_ort_matches_eager_on_real_sentences_of_any_batch_and_length(exported, mini):
    encoder = onnx_tools.OrtEncoder(onnx_tools.ort_session(exported, threads=1))
    texts = ["A cat sat on the mat.", "Short.",
             "A noticeably longer sentence, so that the batch needs padding to its length."]
    for batch in (texts[:1], texts):
        ids, mask = mini.tokenize(batch)
        with torch.no_grad():
            expected = mini.model(ids, mask)
        got = encoder(ids, mask)
        assert got.dtype == torch.float32 and got.shape == (len(batch), minilm.EMBED_DIM)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    via_encode = mini.encode(texts, batch_size=2, model=encoder)
    torch.testing.assert_close(via_encode, mini.encode(texts, batch_size=2), atol=1e-4, rtol=1e-4)


def test_session_options_are_applied(exported):
    session = onnx_tools.ort_session(exported, threads=1, opt_level="basic")
    opts = session.get_session_options()
    assert opts.intra_op_num_threads == 1
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_default_threads_follow_torch(tmp_path):
    path = tmp_path / "id.onnx"
    _identity_model(path)
    session = onnx_tools.ort_session(path)
    assert session.get_session_options().intra_op_num_threads == torch.get_num_threads()


def test_idle_threads_sleep_unless_spinning_is_asked_for(tmp_path):
    path = tmp_path / "id.onnx"
    _identity_model(path)
    default = onnx_tools.ort_session(path).get_session_options()
    spinning = onnx_tools.ort_session(path, spinning=True).get_session_options()
    assert default.get_session_config_entry(onnx_tools.SPINNING_KEY) == "0"
    assert spinning.get_session_config_entry(onnx_tools.SPINNING_KEY) == "1"


def test_missing_file_names_the_fix(tmp_path):
    with pytest.raises(onnx_tools.OnnxModelError, match="export_minilm"):
        onnx_tools.ort_session(tmp_path / "nope.onnx")


def test_corrupt_file_is_refused_clearly(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"this is not a protobuf" * 10)
    with pytest.raises(onnx_tools.OnnxModelError, match="could not load"):
        onnx_tools.ort_session(path)


@pytest.mark.parametrize("kwargs", [{"opt_level": "max"}, {"threads": 0}, {"threads": 1.5},
                                    {"spinning": "no"}])
def test_bad_options_are_refused(tmp_path, kwargs):
    path = tmp_path / "id.onnx"
    _identity_model(path)
    with pytest.raises(ValueError):
        onnx_tools.ort_session(path, **kwargs)


def test_encoder_refuses_a_session_of_another_model(tmp_path):
    path = tmp_path / "id.onnx"
    _identity_model(path)
    with pytest.raises(onnx_tools.OnnxModelError, match="input_ids"):
        onnx_tools.OrtEncoder(onnx_tools.ort_session(path))


def test_output_rename_avoids_the_duplicate_name_bug(tmp_path):
    """An output named after an inner op (here softmax) must still give a loadable model."""

    class Net(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1) * 2

    x = torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(Net(), (x,), dynamo=True, verbose=False)
    inner = {v.name for node in program.model.graph for v in node.outputs}
    assert "softmax" in inner  # the collision this helper exists for
    onnx_tools._rename_output(program, "softmax")
    path = tmp_path / "net.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(["softmax"], {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), torch.softmax(x, -1) * 2)


def test_export_writes_to_the_build_dir_by_default(monkeypatch, tmp_path, exported, mini):
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path))
    target = onnx_tools.default_path()
    target.parent.mkdir(parents=True)
    target.write_bytes(exported.read_bytes())  # pretend an earlier export, to stay fast
    onnx_tools._stamp_path(target).write_text(onnx_tools._stamp_path(exported).read_text())
    assert onnx_tools.export_minilm(mini=mini) == target
    assert os.path.commonpath([target, tmp_path]) == str(tmp_path)


def test_save_program_stamps_a_program_so_export_reuses_it(tmp_path, monkeypatch, mini):
    class TwoInputs(torch.nn.Module):  # same signature as the encoder, cheap to export
        def forward(self, input_ids, attention_mask):
            return (input_ids * attention_mask).float().sum(dim=-1, keepdim=True)

    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path))
    ids = torch.ones(2, 3, dtype=torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(TwoInputs(), (ids, ids), verbose=False,
                                    input_names=["input_ids", "attention_mask"])
    path = onnx_tools.save_program(program)
    assert path == onnx_tools.default_path() and onnx_tools.is_up_to_date(path)
    before = path.stat().st_mtime_ns
    assert onnx_tools.export_minilm(mini=mini) == path  # reused: no new export
    assert path.stat().st_mtime_ns == before
    session = onnx_tools.ort_session(path, threads=1)
    assert [o.name for o in session.get_outputs()] == ["embedding"]


def test_save_program_refuses_other_input_names(tmp_path):
    class Net(torch.nn.Module):
        def forward(self, x):
            return x + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(Net(), (torch.randn(2),), verbose=False)
    with pytest.raises(onnx_tools.OnnxModelError, match="input_names"):
        onnx_tools.save_program(program, tmp_path / "x.onnx")


def _matmul_relu_model(path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    import numpy as np

    weight = numpy_helper.from_array(np.ones((8, 4), dtype=np.float32), "w")
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [inp], [out], initializer=[weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_node_times_sums_the_profiled_runs_per_operator_and_cleans_up(tmp_path):
    import numpy as np

    path = tmp_path / "mm.onnx"
    _matmul_relu_model(path)
    profiles = tmp_path / "profiles"
    session = onnx_tools.ort_session(path, threads=1, opt_level="disable", profile_dir=profiles)
    times = onnx_tools.node_times(session, {"x": np.ones((3, 8), dtype=np.float32)}, runs=2)
    assert set(times) == {"MatMul", "Relu"}
    assert all(ms >= 0 for ms in times.values())
    assert list(profiles.iterdir()) == []  # the JSON file is read, then deleted
    matmul, other = onnx_tools.matmul_split(times)
    assert (matmul, other) == pytest.approx((times["MatMul"], times["Relu"]))


def test_node_times_needs_a_profiling_session(tmp_path):
    path = tmp_path / "mm.onnx"
    _matmul_relu_model(path)
    with pytest.raises(ValueError, match="profile_dir"):
        onnx_tools.node_times(onnx_tools.ort_session(path), {})


def test_matmul_split_counts_every_matrix_multiply_form():
    assert onnx_tools.matmul_split({"MatMul": 2.0, "FusedMatMul": 1.0, "Gemm": 1.0, "Add": 4.0}) == (4.0, 4.0)
    assert onnx_tools.matmul_split({}) == (0.0, 0.0)
