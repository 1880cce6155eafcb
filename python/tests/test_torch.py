"""sluice.torch: torch.Tensors through DLPack, and a DataLoader over a dataset."""

import numpy as np
import pytest
import torch
from torch.utils import dlpack

import sluice
import sluice.torch
from sluice import x


def test_dataloader_yields_tensors_equal_to_numpy(service):
    ds = (sluice.Dataset.range(8)
          .map((x.cast(np.float32) * 0.5, x, x % 2 == 0))
          .batch(4)
          .distribute("distributed_epoch", service.target))
    loader = torch.utils.data.DataLoader(sluice.torch.IterableDataset(ds), batch_size=None,
                                         num_workers=0)
    got = sorted(((tuple(b) for b in loader)), key=lambda b: int(b[1][0]))
    expected = sorted(list(ds), key=lambda b: int(b[1][0]))
    assert len(got) == 2 and len(expected) == 2
    for (f, i, even), (nf, ni, neven) in zip(got, expected):
        assert f.dtype == torch.float32 and i.dtype == torch.int64 and even.dtype == torch.bool
        assert torch.equal(f, torch.from_numpy(nf.copy()))
        assert torch.equal(i, torch.from_numpy(ni.copy()))
        assert even.tolist() == neven.tolist()


def test_single_component_and_training_loop():
    features = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    ds = sluice.Dataset.from_tensors([features]).unbatch().map((x, x * 2)).batch(8)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for inputs, targets in torch.utils.data.DataLoader(sluice.torch.IterableDataset(ds),
                                                       batch_size=None):
        assert inputs.shape == (8, 4)
        loss = ((model(inputs) - targets.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    assert steps == 4
    single = list(sluice.torch.IterableDataset(sluice.Dataset.range(3)))
    assert [int(t) for t in single] == [0, 1, 2] and single[0].dtype == torch.int64


def test_dlpack_is_zero_copy_and_keeps_the_tensor_alive(service):
    big = np.arange(1 << 18, dtype=np.float32)
    ds = sluice.Dataset.from_tensors([big]).distribute(service=service.target)
    it = ds.make_iterator(output="tensor")
    t = next(it)
    as_torch = sluice.torch.to_torch(t)
    assert as_torch.data_ptr() == t.data_ptr == np.asarray(t).ctypes.data
    from_protocol = dlpack.from_dlpack(t)  # __dlpack__ / __dlpack_device__
    assert from_protocol.data_ptr() == t.data_ptr
    del t, it, ds
    assert torch.equal(as_torch, torch.from_numpy(big))
    # A capsule nobody consumed frees its tensor on its own.
    (t2,) = list(sluice.Dataset.from_tensors([big]).make_iterator(output="tensor"))
    capsule = sluice.to_dlpack(t2)
    del capsule


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64,
                                   np.float16, np.float32, np.float64, np.bool_])
def test_dtypes(dtype):
    a = (np.arange(6) % 2).astype(dtype).reshape(2, 3)
    (t,) = list(sluice.Dataset.from_tensors([a]).make_iterator(output="tensor"))
    out = sluice.torch.to_torch(t)
    assert out.shape == (2, 3)
    assert out.tolist() == a.tolist()


def test_bfloat16_travels_as_bfloat16():
    ds = sluice.Dataset.range(3).map(x.cast("bfloat16"))
    out = [sluice.torch.to_torch(t) for t in ds.make_iterator(output="tensor")]
    assert out[2].dtype == torch.bfloat16 and float(out[2]) == 2.0


def test_strings_stay_bytes():
    (t,) = list(sluice.Dataset.from_tensors([(b"abc", np.int32(1))]).make_iterator("tensor"))
    s, i = sluice.torch.to_torch(t)
    assert s == b"abc" and int(i) == 1


class _FakeEvent:
    """A CUDA event stand-in: complete once the test says so."""

    done = False
    recorded = 0

    def record(self):
        _FakeEvent.recorded += 1

    def query(self):
        return _FakeEvent.done

    def synchronize(self):
        _FakeEvent.done = True


def test_device_copier_holds_each_host_tensor_until_its_copy_completed():
    _FakeEvent.done, _FakeEvent.recorded = False, 0
    copier = sluice.torch.DeviceCopier("cpu", make_event=_FakeEvent)
    hosts = [torch.arange(4) + i for i in range(3)]
    outs = [copier(h) for h in hosts]
    assert [o.tolist() for o in outs] == [h.tolist() for h in hosts]
    assert copier.pending() == 3 and _FakeEvent.recorded == 3  # copies in flight: held
    assert copier(b"label") == b"label" and copier.pending() == 3  # strings stay, no event
    _FakeEvent.done = True
    assert copier.pending() == 0  # their events completed: released


def test_iterable_dataset_with_a_device_copies_every_component_and_drains_at_the_end():
    _FakeEvent.done, _FakeEvent.recorded = False, 0
    ds = sluice.Dataset.range(6).map((x, x * 2)).batch(3)
    got = list(sluice.torch.IterableDataset(ds, device="cpu", _make_event=_FakeEvent))
    assert [(a.tolist(), b.tolist()) for a, b in got] == [([0, 1, 2], [0, 2, 4]),
                                                          ([3, 4, 5], [6, 8, 10])]
    assert _FakeEvent.recorded == 4  # one per copied component
    assert _FakeEvent.done  # the iterator's end waited for the copies


def test_state_dict_resumes_a_dataloader_where_the_training_loop_was(tmp_path):
    ds = sluice.Dataset.range(30).shuffle(8).batch(4)
    data = sluice.torch.IterableDataset(ds)
    assert data.state_dict() == {}
    loader = iter(torch.utils.data.DataLoader(data, batch_size=None))
    seen = [next(loader).tolist() for _ in range(3)]
    torch.save({"data": data.state_dict()}, tmp_path / "ckpt.pt")
    rest = [b.tolist() for b in loader]
    assert sorted(v for b in seen + rest for v in b) == list(range(30))
    # A restarted trainer: a new dataset object, the state loaded from disk.
    again = sluice.torch.IterableDataset(ds)
    again.load_state_dict(torch.load(tmp_path / "ckpt.pt")["data"])
    assert again.state_dict() != {}
    resumed = [b.tolist() for b in torch.utils.data.DataLoader(again, batch_size=None)]
    assert resumed == rest
    # Then the next pass starts from the beginning.
    assert again.state_dict() == {}
    assert sorted(v for b in again for v in b.tolist()) == list(range(30))
    other = sluice.torch.IterableDataset(sluice.Dataset.range(31).batch(4))
    other.load_state_dict(data.state_dict() or {"sluice_checkpoint": b"junk"})
    with pytest.raises(ValueError):
        next(iter(other))
