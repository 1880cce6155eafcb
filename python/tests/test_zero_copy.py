"""Zero copy and lifetimes: views of element memory, kept alive by their owners.

Also worth running under AddressSanitizer (docs/python.md):
  LD_PRELOAD=$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
    PYTHONPATH=python /usr/bin/python3 -m pytest -q python/tests/test_zero_copy.py
"""

import gc

import numpy as np

import sluice
from sluice import x

BIG = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: one element per UCX reply


def test_numpy_views_the_tensor_and_ucx_copies_nothing(service):
    before = sluice.transport_stats()
    ds = sluice.Dataset.from_tensors([BIG]).repeat(3).distribute(
        service=service.target, data_transfer_protocol="ucx")
    n = 0
    for t in ds.make_iterator(output="tensor"):
        assert isinstance(t, sluice.Tensor) and t.dtype == "float32" and t.shape == BIG.shape
        a = t.numpy()
        assert a.ctypes.data == t.data_ptr  # a view, not a copy
        assert np.asarray(t).ctypes.data == t.data_ptr
        assert a.base is t
        np.testing.assert_array_equal(a, BIG)
        n += 1
    assert n == 6  # 3 per worker
    # The plain iterator hands out views too: arrays that own no data.
    for a in ds:
        assert not a.flags.owndata and not a.flags.writeable
        np.testing.assert_array_equal(a, BIG)
    after = sluice.transport_stats()
    assert after["ucx_elements_received"] - before["ucx_elements_received"] == 12
    assert after["client_payload_bytes_copied"] == before["client_payload_bytes_copied"]


def test_local_views_share_the_pipeline_tensor():
    (t,) = list(sluice.Dataset.from_tensors([BIG]).make_iterator(output="tensor"))
    assert np.asarray(t).ctypes.data == t.data_ptr


def test_a_view_outlives_its_iterator_and_dataset(service):
    ds = sluice.Dataset.range(4).map(x.cast(np.float32) + BIG).distribute(
        service=service.target, data_transfer_protocol="ucx")
    it = iter(ds)
    kept = next(it)
    value = float(kept[0])
    expected = BIG + value
    it.close()
    del it, ds
    gc.collect()
    # Reuse the receive pool heavily: had the kept slot been returned, these
    # elements would overwrite it.
    churn = sluice.Dataset.range(16).map(x.cast(np.float32) * 0 - 1 + BIG * 0).distribute(
        service=service.target)
    for a in churn:
        pass
    np.testing.assert_array_equal(kept, expected)
    del kept
    gc.collect()


def test_tensor_handles_outlive_the_iterator(service):
    ds = sluice.Dataset.from_tensors([(BIG, b"meta")]).distribute(service=service.target)
    it = ds.make_iterator(output="tensor")
    elements = list(it)
    del it, ds
    gc.collect()
    for arr_t, meta_t in elements:
        np.testing.assert_array_equal(arr_t.numpy(), BIG)
        assert meta_t.numpy() == b"meta" and meta_t.dtype == "string"


def test_dropping_views_releases_their_receive_pool_slots(service):
    """Backpressure: views hold receive-pool slots until they are dropped."""
    base = sluice.transport_stats()["pool_buffers_in_use"]
    ds = sluice.Dataset.from_tensors([BIG]).repeat(3).distribute(
        service=service.target, data_transfer_protocol="ucx")
    held = list(ds)  # 6 views of 1 MiB, one reply each
    assert len(held) == 6
    gc.collect()
    in_use = sluice.transport_stats()["pool_buffers_in_use"]
    assert in_use >= base + len(held)
    del held[:3]
    gc.collect()
    assert sluice.transport_stats()["pool_buffers_in_use"] == in_use - 3
    del held
    gc.collect()
    assert sluice.transport_stats()["pool_buffers_in_use"] == base
