"""How do I run the course's MiniLM (or a model I exported) with ONNX Runtime?

The plumbing behind notebook 07's ONNX Runtime cells (the export itself is taught there):

- ``export_minilm``: export the sentence encoder once (dynamic batch and sequence)
  to ``build/onnx/minilm.onnx``; later calls reuse the file while it is up to date.
  ``save_program`` stores a program you exported yourself the same way.
- ``ort_session``: an ``onnxruntime.InferenceSession`` on the CPU with a chosen
  number of intra-op threads and graph optimisation level, whose idle threads sleep
  instead of spinning (unless asked), with clear errors for a missing or corrupt file.
- ``OrtEncoder``: wraps a session as a callable ``(ids, mask) -> torch.Tensor``,
  so ``mini.encode(texts, model=OrtEncoder(session))`` embeds text through ONNX Runtime.
- ``node_times``: where a session's time goes, per operator type, from ONNX Runtime's own
  profiler (a session opened with ``ort_session(path, profile_dir=...)``); ``matmul_split``
  splits it into matrix multiplies and everything else.

    >>> path = export_minilm()
    >>> session = ort_session(path, threads=2)
    >>> mini.encode(["A cat sat on the mat."], model=OrtEncoder(session)).shape
    torch.Size([1, 384])
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import config

if TYPE_CHECKING:  # pragma: no cover - imported for type hints only
    import onnxruntime

    from ..models.minilm import MiniLM

#: Input and output names of the exported encoder (the serving code relies on them).
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "embedding"
#: Graph optimisation levels accepted by ``ort_session``.
OPT_LEVELS = ("disable", "basic", "extended", "all")
#: The session setting that lets ONNX Runtime's intra-op threads spin while they wait for work.
#: ``OMP_WAIT_POLICY=PASSIVE`` (``course_utils.threads``) does not reach ONNX Runtime's own pool.
SPINNING_KEY = "session.intra_op.allow_spinning"
#: ONNX Runtime operators that are matrix multiplies (standard, fused and quantized forms).
MATMUL_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulInteger", "QLinearMatMul",
                        "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMulNBits", "QGemm"})


class OnnxModelError(RuntimeError):
    """An ONNX file is missing, unreadable or not the model the caller expects."""


def default_path() -> Path:
    """Return where ``export_minilm`` writes by default: ``build/onnx/minilm.onnx``."""
    return config.build_dir() / "onnx" / "minilm.onnx"


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _stamp(opset: int | None) -> dict[str, Any]:
    from ..models.minilm import WEIGHTS_SHA256

    return {"weights_sha256": WEIGHTS_SHA256, "torch": torch.__version__,
            "opset": opset, "inputs": list(INPUT_NAMES), "output": OUTPUT_NAME}


def is_up_to_date(path: str | Path | None = None, *, opset: int | None = None) -> bool:
    """Return True when ``path`` was exported by ``export_minilm`` from the same weights,
    torch version and opset request, and has not been changed since."""
    path = Path(path) if path is not None else default_path()
    stamp = _stamp_path(path)
    if not path.is_file() or not stamp.is_file():
        return False
    try:
        saved = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    size = saved.pop("size", None)
    return saved == _stamp(opset) and size == path.stat().st_size


def _rename_output(program: Any, name: str) -> None:
    """Give the single graph output ``name``, renaming any inner value that already uses it.

    The dynamo exporter names inner values after the aten op that made them (the
    token lookup gives a value called ``embedding``); passing ``output_names=["embedding"]``
    to ``torch.onnx.export`` then yields a model ONNX Runtime refuses ("Duplicate
    definition of name"), so the output is renamed here instead.
    """
    graph = program.model.graph
    out = graph.outputs[0]
    taken = {v.name for node in graph for v in node.outputs if v is not out}
    taken |= {v.name for v in graph.inputs} | set(graph.initializers)
    for node in graph:
        for value in node.outputs:
            if value is not out and value.name == name:
                new, n = f"{name}_inner", 0
                while new in taken:
                    n += 1
                    new = f"{name}_inner{n}"
                value.name = new
                taken.add(new)
    out.name = name


def export_minilm(path: str | Path | None = None, *, opset: int | None = None,
                  mini: MiniLM | None = None, force: bool = False) -> Path:
    """Return the path of the MiniLM encoder exported to ONNX (dynamic batch and sequence).

    Writes ``build/onnx/minilm.onnx`` (or ``path``) with inputs ``input_ids`` and
    ``attention_mask`` (int64, ``(batch, seq)``) and output ``embedding``
    (float32, ``(batch, 384)``), using the dynamo-based ``torch.onnx.export``.
    A file stamped by an earlier call with the same weights, torch version and
    ``opset`` is reused (``force=True`` re-exports). ``opset=None`` takes the
    exporter's default. ``mini`` reuses an already loaded model (else one is loaded).
    """
    path = Path(path) if path is not None else default_path()
    if not force and is_up_to_date(path, opset=opset):
        return path
    if mini is None:
        from ..models.minilm import load_minilm

        mini = load_minilm()
    ids, mask = mini.tokenize(["An example sentence to trace the encoder.", "Two."])
    batch = torch.export.Dim("batch", min=1, max=4096)
    seq = torch.export.Dim("seq", min=2, max=512)
    with warnings.catch_warnings():
        # Both inputs share the two Dims; the exporter warns that it keeps one name for each.
        warnings.filterwarnings("ignore", message=r".*axis name.*will not be used")
        program = torch.onnx.export(
            mini.model.eval(), (ids, mask), dynamo=True, opset_version=opset, verbose=False,
            input_names=list(INPUT_NAMES),
            dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        )
    return save_program(program, path, opset=opset)


def save_program(program: Any, path: str | Path | None = None, *, opset: int | None = None) -> Path:
    """Return the path where an ``ONNXProgram`` of the MiniLM encoder was saved and stamped.

    For a program you exported yourself from ``load_minilm().model`` (inputs named
    ``input_ids`` and ``attention_mask``, ``opset`` as passed to the exporter): the
    output is renamed to ``embedding`` (in place), the file written to ``path``
    (default ``build/onnx/minilm.onnx``) and stamped, so ``export_minilm`` reuses it
    instead of exporting again.
    """
    graph = program.model.graph
    names = tuple(v.name for v in graph.inputs)
    if names != INPUT_NAMES or len(graph.outputs) != 1:
        raise OnnxModelError(f"expected inputs {list(INPUT_NAMES)} and one output, got inputs "
                             f"{list(names)} and {len(graph.outputs)} outputs; export with "
                             "input_names=['input_ids', 'attention_mask'].")
    path = Path(path) if path is not None else default_path()
    _rename_output(program, OUTPUT_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(path))
    _stamp_path(path).write_text(json.dumps({**_stamp(opset), "size": path.stat().st_size}),
                                 encoding="utf-8")
    return path


def ort_session(path: str | Path, *, threads: int | None = None, opt_level: str = "all",
                spinning: bool = False, profile_dir: str | Path | None = None) -> onnxruntime.InferenceSession:
    """Return an ONNX Runtime CPU session on ``path``.

    ``threads`` sets the intra-op thread pool (default: ``torch.get_num_threads()``,
    so ONNX Runtime and eager PyTorch use the same cores); ``opt_level`` is one of
    ``"disable"``, ``"basic"``, ``"extended"``, ``"all"``. ``spinning=False`` (the
    default) makes the pool's idle threads sleep (``SPINNING_KEY`` = "0"): ONNX
    Runtime's own default is to spin, which fights any other busy program for the cores,
    the reason the course sets ``OMP_WAIT_POLICY=PASSIVE`` for torch. ``profile_dir`` turns
    on ONNX Runtime's profiler, writing its JSON file there (read it with ``node_times``). Raises
    ``OnnxModelError`` when the file is missing or ONNX Runtime cannot load it.
    """
    import onnxruntime as ort

    if opt_level not in OPT_LEVELS:
        raise ValueError(f"opt_level must be one of {OPT_LEVELS}, got {opt_level!r}")
    threads = torch.get_num_threads() if threads is None else threads
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    if not isinstance(spinning, bool):
        raise ValueError(f"spinning must be True or False, got {spinning!r}")
    path = Path(path)
    if not path.is_file():
        raise OnnxModelError(f"{path} does not exist; create it with "
                             "course_utils.deploy.onnx_tools.export_minilm() (or torch.onnx.export).")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry(SPINNING_KEY, "1" if spinning else "0")
    opts.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[opt_level]
    opts.log_severity_level = 3  # errors only: keep ONNX Runtime's warnings out of notebooks
    if profile_dir is not None:
        Path(profile_dir).mkdir(parents=True, exist_ok=True)
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(profile_dir) / "ort_profile")
    try:
        return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own Fail / InvalidProtobuf types
        raise OnnxModelError(f"ONNX Runtime could not load {path} ({type(err).__name__}: "
                             f"{str(err)[:300]}); delete it and export again, e.g. "
                             "export_minilm(force=True).") from err


def node_times(session: onnxruntime.InferenceSession, feeds: dict[str, Any], *, runs: int = 3,
               warmup: int = 1) -> dict[str, float]:
    """Return the milliseconds per run that each operator type took, from ONNX Runtime's profiler.

    ``session`` must have been opened with profiling on (``ort_session(path, profile_dir=...)``).
    Runs ``feeds`` ``warmup`` times, then ``runs`` times, and sums the kernel time of every node
    (the ``"Node"`` events, keyed by their ``op_name``) over the timed runs only, divided by
    ``runs``. This ends the session's profiling (``end_profiling``) and deletes the JSON file.
    Node times are measured with the profiler on, so they can exceed an unprofiled run's wall
    time; they leave out the executor's own work between nodes.
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"need runs >= 1 and warmup >= 0, got runs={runs!r}, warmup={warmup!r}")
    if not session.get_session_options().enable_profiling:
        raise ValueError("this session does not profile; open it with ort_session(path, profile_dir=...)")
    for _ in range(warmup + runs):
        session.run(None, feeds)
    profile = Path(session.end_profiling())
    try:
        events = json.loads(profile.read_text(encoding="utf-8"))
    finally:
        profile.unlink(missing_ok=True)
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(starts) < warmup + runs:
        raise RuntimeError(f"ONNX Runtime's profile holds {len(starts)} runs, expected {warmup + runs}")
    first = starts[-runs]  # the first timed run; earlier events are warm-up and session start
    totals: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= first:
            op = e.get("args", {}).get("op_name", "?")
            totals[op] = totals.get(op, 0.0) + e["dur"] / 1e3  # microseconds -> ms
    return {op: ms / runs for op, ms in sorted(totals.items(), key=lambda kv: -kv[1])}


def matmul_split(times: dict[str, float]) -> tuple[float, float]:
    """Return (milliseconds in matrix-multiply operators (``MATMUL_OPS``), milliseconds in all the
    other operators) of ``times``, a ``node_times`` result."""
    matmul = sum(ms for op, ms in times.items() if op in MATMUL_OPS)
    return matmul, sum(ms for op, ms in times.items() if op not in MATMUL_OPS)


class OrtEncoder:
    """A callable ``(input_ids, attention_mask) -> torch.Tensor`` running an ONNX Runtime session.

    Drop-in for the eager encoder: ``mini.encode(texts, model=OrtEncoder(session))``.
    """

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        names = [i.name for i in session.get_inputs()]
        if sorted(names) != sorted(INPUT_NAMES):
            raise OnnxModelError(f"the session's inputs are {names}, expected {list(INPUT_NAMES)}; "
                                 "is this the MiniLM export?")
        self.session = session
        self.output_name = session.get_outputs()[0].name

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Return the float32 embeddings, shape (batch, 384), as a torch tensor."""
        feeds = {
            "input_ids": input_ids.detach().to("cpu", torch.int64).contiguous().numpy(),
            "attention_mask": attention_mask.detach().to("cpu", torch.int64).contiguous().numpy(),
        }
        (out,) = self.session.run([self.output_name], feeds)
        return torch.from_numpy(out)

    def __repr__(self) -> str:
        return f"OrtEncoder({self.session._model_path!r})" if hasattr(self.session, "_model_path") \
            else "OrtEncoder(<session>)"
