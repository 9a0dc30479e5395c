"""The LibTorch trainer (cpp/libtorch_mlp): its output parser, dataset writer, and a real build that
trains, saves weights Python reads with weights_only=True, and runs inference matching Python."""

import subprocess

import pytest
import torch

from course_utils.deploy import cmake_build, libtorch_cpp
from course_utils.deploy.tensor_file import read_tensor
from course_utils.models import MLP

NO_TOOLCHAIN = cmake_build.toolchain_problem()
needs_build = pytest.mark.skipif(NO_TOOLCHAIN is not None, reason=f"cannot build C++ here: {NO_TOOLCHAIN}")

PRINTED = """epoch 1 loss 1.500000 seconds 0.0200
epoch 2 loss 0.600000 seconds 0.0100
test accuracy 441/450
saved /tmp/w.pt
"""


def test_parse_train_output_reads_epochs_and_accuracy():
    run = libtorch_cpp.parse_train_output(PRINTED)
    assert run.losses == [1.5, 0.6] and run.epoch_seconds == [0.02, 0.01]
    assert (run.correct, run.total) == (441, 450) and run.accuracy == 441 / 450


@pytest.mark.parametrize("text, match", [
    ("test accuracy 1/2\n", "no 'epoch"),
    ("epoch 1 loss 1.0 seconds 0.1\n", "no 'test accuracy"),
    ("epoch 2 loss 1.0 seconds 0.1\ntest accuracy 1/2\n", "out of order"),
    ("epoch 1 loss 1.0 seconds 0.1\ntest accuracy 0/0\n", "no 'test accuracy"),
])
def test_parse_train_output_refuses_incomplete_output(text, match):
    with pytest.raises(ValueError, match=match):
        libtorch_cpp.parse_train_output(text)


def test_write_dataset_writes_four_tensor_files(tmp_path):
    x, y = torch.rand(6, 1, 8, 8), torch.tensor([0, 1, 2, 3, 4, 5])
    folder = libtorch_cpp.write_dataset(tmp_path / "d", x, y, x[:2], y[:2])
    assert sorted(p.name for p in folder.iterdir()) == sorted(libtorch_cpp.DATASET_FILES)
    torch.testing.assert_close(read_tensor(folder / "y_train.bin"), y.float(), rtol=0, atol=0)
    torch.testing.assert_close(read_tensor(folder / "x_test.bin"), x[:2], rtol=0, atol=0)


def test_write_dataset_refuses_bad_labels(tmp_path):
    x = torch.rand(3, 64)
    with pytest.raises(ValueError, match="3 images but 2 labels"):
        libtorch_cpp.write_dataset(tmp_path, x, torch.tensor([0, 1]), x, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="whole numbers"):
        libtorch_cpp.write_dataset(tmp_path, x, torch.tensor([0.5, 1.0, 2.0]), x, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"\[0, 2\*\*24\)"):
        libtorch_cpp.write_dataset(tmp_path, x, torch.tensor([0, -1, 2]), x, torch.tensor([0, 1, 2]))


def test_load_weights_refuses_other_files(tmp_path):
    torch.save({"net.0.weight": torch.ones(2)}, tmp_path / "dict.pt")
    with pytest.raises(ValueError, match=r"\(name, tensor\) pairs"):
        libtorch_cpp.load_weights(tmp_path / "dict.pt")
    torch.save((("a", torch.ones(2)), ("b", torch.zeros(1))), tmp_path / "pairs.pt")
    assert list(libtorch_cpp.load_weights(tmp_path / "pairs.pt")) == ["a", "b"]


def test_missing_cmake_is_a_clear_error_for_the_trainer_too(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(cmake_build.CppToolchainMissing, match="cmake was not found"):
        libtorch_cpp.build_trainer(tmp_path / "build")


# --- a real build, once per session (the build folder under build/ persists, so reruns are warm) ---

@pytest.fixture(scope="session")
def trainer() -> cmake_build.Build:
    return libtorch_cpp.build_trainer()


@pytest.fixture(scope="module")
def digits_run(trainer, tmp_path_factory):
    """The trainer run for 3 epochs on a 600-digit slice of the course's digits; returns (run, split)."""
    from course_utils.data import load_digits_split

    split = load_digits_split()
    folder = tmp_path_factory.mktemp("libtorch")
    data = libtorch_cpp.write_dataset(folder / "data", split.x_train[:600], split.y_train[:600],
                                      split.x_test, split.y_test)
    run = libtorch_cpp.train(trainer.binary, data, folder / "weights.pt", epochs=3, seed=0, threads=1)
    return run, split


@needs_build
def test_build_is_reused_when_fresh(trainer):
    again = libtorch_cpp.build_trainer()
    assert again.binary == trainer.binary and not again.rebuilt


@needs_build
def test_training_lowers_the_loss_and_learns(digits_run):
    run, _ = digits_run
    assert len(run.losses) == 3 and len(run.epoch_seconds) == 3
    assert run.losses[-1] < run.losses[0] * 0.7, run.losses
    assert run.total == 450 and run.accuracy > 0.5, run  # ten classes: chance is 0.1


@needs_build
def test_weights_round_trip_into_python_with_the_same_accuracy(digits_run):
    run, split = digits_run
    state = libtorch_cpp.load_weights(run.weights)
    model = MLP(64, 128, 10, depth=2)
    model.load_state_dict(state)  # strict: every name and shape must match Python's MLP
    with torch.no_grad():
        correct = (model(split.x_test.flatten(1)).argmax(1) == split.y_test).sum().item()
    assert correct == run.correct


@needs_build
def test_cpp_forward_matches_python(digits_run, trainer, tmp_path):
    run, split = digits_run
    model = MLP(64, 128, 10, depth=2).eval()
    model.load_state_dict(libtorch_cpp.load_weights(run.weights))
    for x in (split.x_test[:1], split.x_test[:37]):
        out = libtorch_cpp.infer(trainer.binary, run.weights, x, work_dir=tmp_path)
        with torch.no_grad():
            torch.testing.assert_close(out, model(x.flatten(1)), rtol=0, atol=1e-5)
    assert list(tmp_path.iterdir()) == [], "infer left files behind"


@needs_build
def test_same_seed_gives_python_s_initial_weights(trainer, tmp_path):
    """torch::manual_seed and torch.manual_seed drive one generator: with 1 epoch at lr ~0 the saved
    weights are the initial ones, and they equal Python's MLP made after the same seed."""
    x, y = torch.rand(8, 64), torch.arange(8) % 10
    y[-1] = 9  # the program counts classes as the largest label + 1
    data = libtorch_cpp.write_dataset(tmp_path / "d", x, y, x, y)
    run = libtorch_cpp.train(trainer.binary, data, tmp_path / "w.pt", epochs=1, lr=1e-30, seed=3, threads=1)
    torch.manual_seed(3)
    expected = MLP(64, 128, 10, depth=2).state_dict()
    got = libtorch_cpp.load_weights(run.weights)
    assert list(got) == list(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)


@needs_build
def test_program_errors_are_reported(trainer, tmp_path):
    with pytest.raises(cmake_build.ProgramFailed, match="libtorch_mlp.*cannot open"):
        libtorch_cpp.train(trainer.binary, tmp_path / "nowhere", tmp_path / "w.pt", epochs=1)
    with pytest.raises(cmake_build.ProgramFailed, match="unknown option"):
        cmake_build.run_program([trainer.binary, "train", tmp_path, tmp_path / "w.pt", "--epoch", "2"])
    with pytest.raises(cmake_build.ProgramFailed, match="usage"):
        cmake_build.run_program([trainer.binary])


@needs_build
def test_shared_libraries_lists_libtorch(trainer):
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("ldd is Linux-only")
    libs = {lib.name: lib for lib in cmake_build.shared_libraries(trainer.binary)}
    assert libs["libtorch_cpu.so"].origin == "torch" and libs["libtorch_cpu.so"].size_bytes > 1_000_000
    assert all(lib.path is not None for lib in libs.values()), "an unresolved library"
    with pytest.raises(RuntimeError, match="ldd"):
        cmake_build.shared_libraries(trainer.binary.parent / "no-such-binary")


def test_run_program_times_out(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        cmake_build.run_program(["sleep", "5"], timeout_s=0.1)


# --- exercise 06.read_cpp_output reads the program's lines as libtorch_cpp does ---

def test_exercise_reference_agrees_with_the_parser_and_by_hand():
    from course_utils import exercises
    from course_utils.exercises import nb06

    for text in (*nb06._CPP_OUTPUTS, PRINTED):
        run = libtorch_cpp.parse_train_output(text)
        assert exercises.solution("06.read_cpp_output")(text) == (run.losses[-1], run.accuracy)
    assert nb06.summarise_run(PRINTED) == (0.6, 441 / 450)  # by hand: last epoch's loss, 441 of 450


def test_exercise_hints_a_learner_who_reports_the_hit_count():
    from course_utils import exercises

    def hits(text):
        last = [ln for ln in text.splitlines() if ln.startswith("epoch")][-1]
        return float(last.split()[3]), int(text.split("test accuracy ")[1].split("/")[0])

    fb = exercises.check("06.read_cpp_output", hits, strict=True)
    assert not fb.correct and "correct / total" in fb.message
