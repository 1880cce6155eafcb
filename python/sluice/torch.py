"""PyTorch integration: sluice elements as torch.Tensors without a copy.

    import sluice, sluice.torch, torch
    loader = torch.utils.data.DataLoader(sluice.torch.IterableDataset(ds),
                                         batch_size=None, num_workers=0)
    for images, labels in loader:
        ...

Tensors travel through DLPack: each torch.Tensor views the sluice tensor's
memory (for example its slot of the UCX receive pool), which stays alive
until the torch.Tensor and every view of it are gone.

With IterableDataset(ds, device="cuda:0") elements arrive on the GPU: each
component is copied with .to(device, non_blocking=True) on the current
stream -- a direct DMA from the receive arena, which sluice page-locks for
CUDA (distribute(..., cuda_pinned="auto")) -- and the host tensor, and so
its arena slot, is kept until the copy's event completed, so the slot is
not reused under the copy.
"""

import collections as _collections

import torch as _torch
import torch.utils.data as _data
from torch.utils import dlpack as _dlpack

from . import _sluice

__all__ = ["IterableDataset", "to_torch", "DeviceCopier"]


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


class DeviceCopier:
    """Copies host tensors to `device` asynchronously (non_blocking) and keeps
    each host tensor alive until an event recorded after its copy completed:
    memory sluice received into (an arena slot) is reused only after the GPU
    has read it. torch does not do this for memory it did not allocate.

    `make_event` (tests) builds the event; default torch.cuda.Event().
    """

    def __init__(self, device, make_event=None):
        self.device = _torch.device(device)
        self._make_event = make_event or _torch.cuda.Event
        self._pending = _collections.deque()  # (event, host tensor), in order

    def __call__(self, host):
        if not isinstance(host, _torch.Tensor):
            return host  # strings stay on the host
        out = host.to(self.device, non_blocking=True)
        event = self._make_event()
        event.record()
        self._pending.append((event, host))
        self._reap()
        return out

    def _reap(self):
        while self._pending and self._pending[0][0].query():
            self._pending.popleft()

    def pending(self):
        """Host tensors still held for copies in flight."""
        self._reap()
        return len(self._pending)

    def synchronize(self):
        """Waits for every copy and releases every host tensor."""
        while self._pending:
            event, _ = self._pending.popleft()
            event.synchronize()


class IterableDataset(_data.IterableDataset):
    """A torch IterableDataset over a sluice.Dataset.

    Each iteration is a new pass over `dataset` (a new iteration of its
    service job). Elements come as torch.Tensors, or tuples of them, without
    a copy. Use DataLoader(batch_size=None, num_workers=0): sluice already
    batches (Dataset.batch) and runs the pipeline on its own threads or the
    service's workers; DataLoader worker processes would each read the whole
    dataset, so they are refused.

    Checkpoints follow torch's state_dict convention (torchdata's
    StatefulDataLoader, torch.distributed.checkpoint's Stateful):
    state_dict() is the position of the pass under way, after the last
    element it yielded, and load_state_dict(state) makes the next pass
    resume there (docs/checkpointing.md). Save it with the model's state:
    with DataLoader(num_workers=0) the position is exactly what the
    training loop received. A distributed_epoch pipeline read by several
    ranks: every rank's state_dict() of one step goes through
    merge_state_dicts, and every rank of the resumed job loads the result.
    """

    def __init__(self, dataset, device=None, _make_event=None):
        super().__init__()
        if not isinstance(dataset, _sluice.Dataset):
            raise TypeError("sluice.torch.IterableDataset needs a sluice.Dataset; got "
                            + type(dataset).__name__)
        self.dataset = dataset
        # None: elements stay on the host. Else they arrive on `device`
        # (DeviceCopier), e.g. "cuda:0".
        self.device = None if device is None else _torch.device(device)
        self._make_event = _make_event
        self._iterator = None  # the pass under way
        self._resume = None    # a checkpoint the next pass starts from

    def state_dict(self):
        """{"sluice_checkpoint": bytes}: the pass under way's position (or
        the one loaded and not yet resumed); {} when the next pass starts
        from the beginning."""
        if self._iterator is not None:
            return {"sluice_checkpoint": self._iterator.save()}
        return {} if self._resume is None else {"sluice_checkpoint": self._resume}

    def load_state_dict(self, state_dict):
        """The next pass resumes where state_dict() was taken ({}: from
        the beginning). ValueError (at the next pass) for a checkpoint of
        another pipeline."""
        self._resume = state_dict.get("sluice_checkpoint")

    def __iter__(self):
        if _data.get_worker_info() is not None:
            raise RuntimeError(
                "sluice.torch.IterableDataset runs in the main process: use "
                "DataLoader(..., num_workers=0); sluice parallelizes the pipeline itself")
        copier = None
        if self.device is not None:
            copier = DeviceCopier(self.device, self._make_event)
        it = self.dataset.make_iterator(output="tensor", checkpoint=self._resume)
        self._resume = None
        self._iterator = it
        try:
            for element in it:
                out = to_torch(element)
                if copier is not None:
                    out = tuple(map(copier, out)) if isinstance(out, tuple) else copier(out)
                yield out
        finally:
            if self._iterator is it:
                self._iterator = None
            if copier is not None:
                copier.synchronize()
            it.close()


def merge_state_dicts(state_dicts):
    """One state_dict from the IterableDataset.state_dict() of every rank
    reading one distributed_epoch job, taken at the same step
    (sluice.merge_checkpoints): each rank of the resumed job, however many
    there are, load_state_dict()s it. Ranks that had not started a pass
    ({}) add nothing; all of them: {}."""
    saved = [s["sluice_checkpoint"] for s in state_dicts if s.get("sluice_checkpoint")]
    if not saved:
        return {}
    return {"sluice_checkpoint": _sluice.merge_checkpoints(saved)}
