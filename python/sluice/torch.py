"""PyTorch integration: sluice elements as torch.Tensors without a copy.

    import sluice, sluice.torch, torch
    loader = torch.utils.data.DataLoader(sluice.torch.IterableDataset(ds),
                                         batch_size=None, num_workers=0)
    for images, labels in loader:
        ...

Tensors travel through DLPack: each torch.Tensor views the sluice tensor's
memory (for example its slot of the UCX receive pool), which stays alive
until the torch.Tensor and every view of it are gone.
"""

import torch as _torch
import torch.utils.data as _data
from torch.utils import dlpack as _dlpack

from . import _sluice

__all__ = ["IterableDataset", "to_torch"]


def _component_to_torch(t):
    if t.dtype == "string":
        return t.numpy()  # bytes, or (nested) lists of bytes: torch has no strings
    out = _dlpack.from_dlpack(t.__dlpack__())
    if t.dtype == "bool":
        out = out.view(_torch.bool)  # DLPack (torch 1.13) carries bool as uint8
    return out


def to_torch(element):
    """A sluice.Tensor, or a tuple of them, as torch.Tensor(s) without a copy.

    String components become bytes (or lists of bytes). Treat the result as
    read-only: it may share memory with the pipeline (a from_tensors
    constant passed through unchanged, for example).
    """
    if isinstance(element, tuple):
        return tuple(_component_to_torch(t) for t in element)
    return _component_to_torch(element)


class IterableDataset(_data.IterableDataset):
    """A torch IterableDataset over a sluice.Dataset.

    Each iteration is a new pass over `dataset` (a new iteration of its
    service job). Elements come as torch.Tensors, or tuples of them, without
    a copy. Use DataLoader(batch_size=None, num_workers=0): sluice already
    batches (Dataset.batch) and runs the pipeline on its own threads or the
    service's workers; DataLoader worker processes would each read the whole
    dataset, so they are refused.
    """

    def __init__(self, dataset):
        super().__init__()
        if not isinstance(dataset, _sluice.Dataset):
            raise TypeError("sluice.torch.IterableDataset needs a sluice.Dataset; got "
                            + type(dataset).__name__)
        self.dataset = dataset

    def __iter__(self):
        if _data.get_worker_info() is not None:
            raise RuntimeError(
                "sluice.torch.IterableDataset runs in the main process: use "
                "DataLoader(..., num_workers=0); sluice parallelizes the pipeline itself")
        it = self.dataset.make_iterator(output="tensor")
        try:
            for element in it:
                yield to_torch(element)
        finally:
            it.close()
