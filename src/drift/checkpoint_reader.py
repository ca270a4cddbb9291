"""Reading a DCP checkpoint without running code from it.

DCP keeps a checkpoint's index (``.metadata``) as a pickle, which torch's ``FileSystemReader`` loads
with the unrestricted ``pickle.load``, and it loads the non-tensor values of a state dict (an
optimizer's ``lr``, ``betas``, ...) with ``torch.load(weights_only=False)``: a checkpoint folder
someone else could write runs whatever its files tell the unpickler to.

``CheckpointReader`` unpickles ``.metadata`` with an allow-list (``ALLOWED``): DCP's metadata
dataclasses, the torch values they hold (sizes, dtypes, layouts) and plain containers and scalars;
any other global is refused (``RefusedGlobal``) before it is looked up, so nothing in the file runs.
``WeightsOnlyLoadPlanner`` loads the non-tensor values with ``torch.load(weights_only=True)``, the
unpickler torch uses for tensors (DCP's own reader already loads tensors that way). Pass both to
``torch.distributed.checkpoint.load``.
"""

from __future__ import annotations

import importlib
import io
import pickle
import re
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_METADATA = "torch.distributed.checkpoint.metadata"
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)

# (module, name) of every global a DCP ``.metadata`` written by drift may name (see
# tests/test_checkpoint_reader.py, which checks this list against what the installed torch writes).
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        *(
            (_METADATA, name)
            for name in (
                "Metadata",
                "StorageMeta",
                "MetadataIndex",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "TensorProperties",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # a layout by its name, from torch's own table
        *(("torch", name) for name, value in vars(torch).items() if isinstance(value, _TORCH_VALUES)),
        ("pathlib", "PosixPath"),  # the checkpoint's path, in StorageMeta
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "complex"),
    }
)


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle named a global outside the allow-list; ``name`` is ``module.name``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"refused to load {name}")
        self.name = name


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals of ``ALLOWED``."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise RefusedGlobal(f"{module}.{name}")
        return getattr(importlib.import_module(module), name)


def load_metadata(file: io.BufferedIOBase) -> Any:
    """Unpickle a DCP ``.metadata`` stream with the allow-list; ``RefusedGlobal`` for any other global."""
    return _RestrictedUnpickler(file).load()


class CheckpointReader(FileSystemReader):
    """torch's ``FileSystemReader`` whose ``read_metadata`` unpickles with the allow-list; a ``.metadata``
    that is not DCP's metadata raises ``RefusedGlobal`` (or another ``UnpicklingError``)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        with open(self.fs.concat_path(self.path, name), "rb") as file:
            metadata = load_metadata(file)
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"holds a {type(metadata).__name__}, not DCP's Metadata")
        # As torch's reader does: a load id, so that DCP can tell this load's reads apart.
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class RefusedData(pickle.UnpicklingError):
    """A checkpoint's non-tensor value that ``torch.load(weights_only=True)`` refused; the message names
    the value and the global it would have loaded."""


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading a state dict's non-tensor values (an optimizer's
    hyper-parameters) with ``torch.load(weights_only=True)`` rather than torch's unrestricted load."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            found = re.search(r"GLOBAL (\S+)", str(exc))
            why = f"refused to load {found.group(1)}" if found else str(exc).strip().splitlines()[0]
            raise RefusedData(f"{read_item.dest_index.fqn}: not checkpoint data ({why})") from None
        # The default planner places the value where the state dict wants it (nested or flat). It
        # unpickles what it is given without restriction, so it is given only what torch.save writes of the
        # value the weights-only load produced, never the file's bytes.
        super().load_bytes(read_item, _saved(loaded))


def _saved(value: Any) -> io.BytesIO:
    """``value`` as ``torch.save`` writes it, rewound."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer
