"""``drift export``: a trained model as one file for one device (``export``, read back by ``load_exported``),
or in neuraloperator's own checkpoint format (``export_neuralop``).

The file is a dict that ``torch.load(path, weights_only=True)`` reads: nothing in it runs code. It
holds tensors, str, int, float, bool, None, lists and dicts only:

- ``format`` (``FORMAT``), ``version`` (``VERSION``), ``drift`` (the version that wrote it);
- ``fno``: the ``drift.nn.FNO`` arguments that rebuild the model, ``non_linearity`` as the name of a
  ``torch.nn.functional`` function (``drift.nn.FNO(**fno)`` once that name is resolved);
- ``state_dict``: its weights, plain CPU tensors, as DCP gathers them from the run's checkpoint
  (whatever number of ranks wrote it);
- ``stats``: the normalisation statistics of the run's training set (``fields``, ``mean``, ``std``);
- ``inputs``: how the model's input is assembled from raw frames: ``t_in``, ``t_out``, the ``recipe``
  and its ``target``, the ``inputs`` and ``fields`` channels and the layouts in words
  (``drift.predict.predictor.Predictor`` does it);
- ``trained``: the checkpoint, its epoch, the grid and the ranks it was trained on.

``load_exported(path)`` (also ``drift.load_exported``) rebuilds the model on one device and returns a
``Predictor``: raw frames ``(batch, inputs, t_in, *space)`` in, de-normalised predicted frames
``(batch, fields, t_out, *space)`` out. Both writers write under a temporary name and rename at the
end, and refuse to replace an existing output unless told to.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

import drift
from drift.data import Stats
from drift.data.writer import write_failure
from drift.nn import FNO, to_neuralop
from drift.predict.predictor import Predictor
from drift.recipes import recipe_named
from drift.train import Trained, fno_options, load_trained, trained_config
from drift.train.sharding import saved_channels

FORMAT = "drift-fno"
VERSION = 2  # 2: the recipe, its target and the input channels; a version 1 file is a one-shot model
READS = (1, 2)
# What a file says of the model's inputs and outputs, per recipe (``drift.recipes``).
FRAMES = {
    "static": "(batch, inputs, 1, *space): the input fields in physical units",
    "one-shot": "(batch, fields, t_in, *space): each field's first t_in frames in physical units",
    "autoregressive": "(batch, fields, t_in, *space): each field's first t_in frames in physical units",
}
MODEL_INPUTS = {
    "static": "(batch, inputs, *space): the input fields normalised per channel ((value - mean) / std)",
    "one-shot": "(batch, fields * t_in + 1, *space, t_out): the frames normalised per field ((frames - mean) / "
    "std), field-major, each repeated along the t_out time points, then t / t_out for t = 1..t_out",
    "autoregressive": "(batch, fields * t_in, *space): the last t_in frames normalised per field, field-major; "
    "fed back t_out times, each output frame replacing the oldest",
}
MODEL_OUTPUTS = {
    "static": "(batch, fields, *space): normalised; y * std + mean de-normalises",
    "one-shot": "(batch, fields, *space, t_out): normalised; y * std + mean de-normalises",
    "autoregressive": "(batch, fields, *space): the next frame normalised (target state) or its change from the "
    "last input frame (target increment); y * std + mean de-normalises",
}
NEURALOP_NAME = "model"  # neuraloperator's save_name: model_state_dict.pt, model_metadata.pkl
SIDECAR = "drift.json"  # next to them: the statistics and the input assembly, which neuraloperator's files lack


class ExportError(ValueError):
    """A model that cannot be exported as asked, or an output that cannot be written; the message names
    the option or the file."""


def _function_name(fn: Callable) -> str:
    """The name of ``fn`` in ``torch.nn.functional``; ExportError if it has none there."""
    name = getattr(fn, "__name__", "")
    if getattr(F, name, None) is not fn:
        raise ExportError(f"non_linearity {fn!r} is not a torch.nn.functional function: it cannot be named")
    return name


def _plain(value):
    """``value`` with tuples as lists (the options' sequences)."""
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


def _trained(checkpoint: str | Path) -> Trained:
    """The checkpoint's model on the CPU of this process, no ranks (any method computes the same function
    on one device: drift's)."""
    config = trained_config(checkpoint, method="drift")
    trained = load_trained(checkpoint, config, None, "cpu")
    trained.model.eval()
    return trained


def _description(trained: Trained) -> dict:
    """What a model's file needs besides its weights: statistics, inputs, provenance."""
    config, stats = trained.config, trained.stats
    inputs, fields = saved_channels(trained.meta)
    return dict(
        stats=dict(fields=list(stats.fields), mean=list(stats.mean), std=list(stats.std)),
        inputs=dict(
            t_in=config.t_in,
            t_out=config.t_out,
            recipe=config.recipe,
            target=config.target,
            inputs=list(inputs),
            fields=list(fields),
            frames=FRAMES[config.recipe],
            model_input=MODEL_INPUTS[config.recipe],
            model_output=MODEL_OUTPUTS[config.recipe],
        ),
        trained=dict(
            checkpoint=str(trained.checkpoint.resolve()),
            epoch=trained.meta["epoch"],
            grid=list(trained.meta["global_shape"]),
            ranks=trained.meta["world_size"],
        ),
    )


def exported(checkpoint: str | Path) -> dict:
    """The file ``export`` writes, as a dict (see the module's notes); one process, no ranks."""
    trained = _trained(checkpoint)
    default = inspect.signature(FNO).parameters["non_linearity"].default
    options = {k: _plain(v) for k, v in fno_options(trained.config, *saved_channels(trained.meta)).items()}
    options["non_linearity"] = _function_name(default)
    weights = {k: v.detach().cpu().contiguous() for k, v in trained.model.state_dict().items()}
    return dict(format=FORMAT, version=VERSION, drift=drift.__version__, fno=options, state_dict=weights) | (
        _description(trained)
    )


def _publish(path: Path, write: Callable[[Path], None], force: bool) -> Path:
    """Write ``path`` (a file or a folder) by ``write(temp)`` under a temporary name, then rename it to
    ``path``; ExportError naming it when it exists without ``force`` or the writing fails (the partial
    output is then removed)."""
    if path.exists() and not force:
        raise ExportError(f"{path} exists: pass --force to replace it")
    temp, old = (path.with_name(f"{path.name}.{os.getpid()}.{end}") for end in ("partial", "old"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(temp)
        if temp.is_dir() and path.is_dir():  # a folder cannot replace a folder in one rename
            os.replace(path, old)
        os.replace(temp, path)
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {write_failure(exc)}; nothing written") from None
    finally:
        for leftover in (temp, old):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
    return path


def export(checkpoint: str | Path, path: str | Path, *, force: bool = False) -> Path:
    """Write the model of ``checkpoint`` (a run folder: its latest checkpoint that loads; its
    ``checkpoints`` folder or one checkpoint) to the single-device file ``path`` (see the module's notes).
    ``force``: replace an existing ``path``. One process, no ranks. Returns ``path``."""
    record = exported(checkpoint)
    return _publish(Path(path), lambda temp: torch.save(record, temp), force)


def export_neuralop(checkpoint: str | Path, folder: str | Path, *, force: bool = False) -> Path:
    """Write the model of ``checkpoint`` as a neuraloperator 2.0 ``FNO`` checkpoint into ``folder``: its
    ``save_checkpoint(folder, "model")`` files (``model_state_dict.pt``, ``model_metadata.pkl``;
    ``neuralop.models.FNO.from_checkpoint(folder, "model")`` reads them) and ``drift.json`` (the
    statistics, the input assembly and provenance of the module's notes). ExportError naming the option
    when neuraloperator's FNO cannot compute the model's function (``drift.nn.to_neuralop``)."""
    trained = _trained(checkpoint)
    try:
        theirs = to_neuralop(trained.model)
    except ImportError:
        raise ExportError("--format neuralop needs the neuraloperator package (pip install neuraloperator)") from None
    except ValueError as exc:
        config = trained.config
        raise ExportError(
            f"--format neuralop: the run's model (--model {config.model}, --layers {config.layers}) has no "
            f"neuraloperator equivalent: {exc}"
        ) from None
    sidecar = json.dumps(_description(trained), indent=2) + "\n"

    def write(temp: Path) -> None:
        temp.mkdir()
        theirs.save_checkpoint(temp, NEURALOP_NAME)
        (temp / SIDECAR).write_text(sidecar)

    return _publish(Path(folder), write, force)


# drift export --format: the writer of each format.
EXPORTERS = {"pt": export, "neuralop": export_neuralop}


def load_exported(path: str | Path, device: torch.device | str = "cpu") -> Predictor:
    """The model of a file ``export`` wrote, on ``device``, in eval mode: a ``Predictor`` whose call on raw
    frames ``(batch, fields, t_in, x, y, z)`` returns the de-normalised predicted frames ``(batch, fields,
    t_out, x, y, z)`` (float32). Reads the file with ``torch.load(weights_only=True)``; ValueError naming
    the file when it is not such a file. The caller's random state is left as it was.

    Example: a small model trained for one epoch on generated data, exported, loaded and called:

    >>> import tempfile, torch, drift
    >>> from drift.data import generate
    >>> from drift.export import export
    >>> from drift.train import TrainConfig, train
    >>> folder = tempfile.mkdtemp()
    >>> generate(f"{folder}/cfd.hdf5", samples=4, resolution=8, frames=7, seed=1, progress=False)
    >>> config = TrainConfig(data=f"{folder}/cfd.hdf5", out=f"{folder}/run", t_in=2, t_out=4, width=4,
    ...                      modes=(2, 2, 2, 2), layers=2, epochs=1, plots=False, quiet=True)
    >>> history = train(config)
    >>> path = export(f"{folder}/run", f"{folder}/model.pt")
    >>> model = drift.load_exported(path)
    >>> model(torch.randn(1, 5, 2, 8, 8, 8)).shape  # 5 fields: 2 frames in, 4 predicted
    torch.Size([1, 5, 4, 8, 8, 8])
    """
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path}: not a file drift export wrote ({type(exc).__name__}: {exc})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path}: not a file drift export wrote (no format {FORMAT!r})")
    if record.get("version") not in READS:
        raise ValueError(f"{path}: format version {record.get('version')}, this drift reads {READS}")
    options = dict(record["fno"])
    name = options.pop("non_linearity")
    non_linearity = getattr(F, name, None)
    if not callable(non_linearity):
        raise ValueError(f"{path}: non_linearity {name!r} is not a torch.nn.functional function")
    with torch.random.fork_rng(devices=[]):  # built on the CPU: the CUDA generators are not touched
        model = FNO(**options, non_linearity=non_linearity)
    model.load_state_dict(record["state_dict"])
    stats = Stats(**{k: tuple(v) for k, v in record["stats"].items()})
    inputs = record["inputs"]
    recipe = recipe_named(inputs.get("recipe", "one-shot"), inputs.get("target", "state"))
    channels = dict(inputs=inputs.get("inputs"), fields=inputs.get("fields"))
    return Predictor(model, stats, inputs["t_in"], inputs["t_out"], recipe, **channels).to(device).eval()
