"""Pipelines on an in-process service: DispatchServer + WorkerServers."""

import threading
import time

import numpy as np
import pytest

import sluice
from sluice import x


def ints(ds):
    return sorted(int(e) for e in ds)


def test_seed_example_on_the_service(service):
    ds = sluice.Dataset.range(5).map(x * x).distribute(
        processing_mode="parallel_epochs", service=service.target, job_name=None,
        max_outstanding_requests=8).map(x + 1)
    # parallel_epochs: each of the two workers produces the whole dataset.
    assert ints(ds) == [1, 1, 2, 2, 5, 5, 10, 10, 17, 17]
    assert ints(ds) == [1, 1, 2, 2, 5, 5, 10, 10, 17, 17]  # a new iteration


def test_grpc_data_path(service):
    ds = sluice.Dataset.range(5).distribute(service=service.target,
                                            data_transfer_protocol="grpc")
    assert ints(ds) == sorted(list(range(5)) * 2)


def test_distributed_epoch_delivers_each_element_once(service):
    ds = sluice.Dataset.range(100).map(x * 2).distribute("distributed_epoch", service.target)
    assert ints(ds) == list(range(0, 200, 2))


def test_shared_job_with_two_consumers(service):
    got = [[], []]
    errors = []
    joined = threading.Barrier(2)

    def consume(c):
        try:
            # Each consumer builds its own dataset, as separate trainers would.
            ds = sluice.Dataset.range(20).distribute(service=service.target, job_name="shared")
            it = iter(ds)
            joined.wait()
            got[c] = [int(e) for e in it]
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=consume, args=(c,)) for c in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    # The consumers split the job's elements: two workers, each element twice.
    assert sorted(got[0] + got[1]) == sorted(list(range(20)) * 2)


def test_register_dataset_and_from_dataset_id(service):
    dataset_id = sluice.register_dataset(service.target, sluice.Dataset.range(4).map(x + 10))
    assert dataset_id == sluice.register_dataset(service.target,
                                                 sluice.Dataset.range(4).map(x + 10))
    ds = sluice.Dataset.from_dataset_id("distributed_epoch", service.target, dataset_id)
    assert ints(ds.map(x * 2)) == [20, 22, 24, 26]
    named = sluice.register_dataset(service.target, sluice.Dataset.range(2), dataset_id="two")
    assert named == "two"


def test_a_distributed_dataset_shows_no_token_and_no_tls_path(service):
    tls = sluice.TlsConfig("/secret/client.pem", "/secret/client.key", "/secret/ca.pem")
    ds = sluice.Dataset.range(3).distribute(service=service.target, auth_token="py-secret-token",
                                            tls=tls).map(x + 1)
    for text in (repr(ds), ds.serialize().decode("latin-1")):
        for secret in ("py-secret-token", "/secret/"):
            assert secret not in text
    assert service.target in repr(ds)  # what it reads is shown
    rebuilt = sluice.Dataset.deserialize(ds.serialize())
    with pytest.raises(RuntimeError, match="rebuilt from its definition"):
        list(rebuilt)


def test_multi_component_elements_and_strings(service):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    ds = sluice.Dataset.from_tensors([(a, b"label", np.array([True, False]))]).distribute(
        service=service.target)
    out = list(ds)
    assert len(out) == 2
    for arr, label, mask in out:
        np.testing.assert_array_equal(arr, a)
        assert label == b"label"
        assert mask.dtype == np.bool_ and mask.tolist() == [True, False]


def test_servers_properties_and_context_managers():
    with sluice.DispatchServer(port=0) as d:
        assert d.target == f"grpc://{d.address}" and d.port > 0
        assert d.metrics_port == -1
        with sluice.WorkerServer.start(dispatcher_address=d.target,
                                       data_transfer_protocol="grpc") as w:
            assert w.port > 0 and w.transfer_address == w.address
            assert ints(sluice.Dataset.range(3).distribute(service=d.target)) == [0, 1, 2]
        with pytest.raises(ValueError, match="stopped"):
            w.address


def test_next_releases_the_gil(hang_guard):
    """Another thread runs while next() waits for a worker that starts later.

    The pipeline has no worker when next() is called; a second Python thread
    starts one after 0.5 s. Had next() kept the GIL, that thread could not
    run and next() would never return (the hang guard would end the run).
    """
    sluice.set_log_level("off")  # the late worker's first heartbeat is retried
    with sluice.DispatchServer() as dispatcher:
        counter = [0]
        done = threading.Event()
        workers = []

        def count():
            while not done.is_set():
                counter[0] += 1
                time.sleep(0.001)

        def start_worker_later():
            time.sleep(0.5)
            workers.append(sluice.WorkerServer(dispatcher_address=dispatcher.address))

        threads = [threading.Thread(target=count), threading.Thread(target=start_worker_later)]
        it = iter(sluice.Dataset.range(3).distribute(service=dispatcher.target))
        for t in threads:
            t.start()
        before = counter[0]
        start = time.monotonic()
        first = next(it)
        waited = time.monotonic() - start
        during = counter[0] - before
        done.set()
        for t in threads:
            t.join()
        rest = [int(e) for e in it]
        it.close()
        for w in workers:
            w.stop()
    sluice.set_log_level("error")
    assert sorted([int(first)] + rest) == [0, 1, 2]
    assert waited >= 0.4
    assert during >= 50  # the counter ran while the main thread was in next()


def test_a_service_iterator_cannot_save_yet(service):
    ds = sluice.Dataset.range(5).distribute(service=service.target)
    it = ds.make_iterator()
    first = int(next(it))
    with pytest.raises(NotImplementedError, match="Distribute cannot save"):
        it.save()
    # The iterator reads on: together the same elements as a whole pass.
    assert sorted([first] + ints(it)) == sorted(ints(ds))



def test_compression_option_delivers_the_same_elements(service):
    ds = sluice.Dataset.range(2000).batch(500)
    for codec in ["none", "lz4", "zstd", "AUTO"]:
        got = [np.asarray(e) for e in ds.distribute(service=service.target, compression=codec)]
        assert sorted(int(v) for b in got for v in b) == sorted(list(range(2000)) * 2)
    with pytest.raises(ValueError, match="compression must be AUTO, none, lz4 or zstd"):
        ds.distribute(service=service.target, compression="snappy")


def test_max_elements_per_reply_keyword(service):
    ds = sluice.Dataset.range(300)
    got = [int(np.asarray(e)) for e in ds.distribute(service=service.target,
                                                     max_elements_per_reply=1)]
    assert sorted(got) == sorted(list(range(300)) * 2)
    with pytest.raises(ValueError, match=r"max_elements_per_reply must be in \[1, 256\]"):
        ds.distribute(service=service.target, max_elements_per_reply=0)


def _fresh_service(workers):
    dispatcher = sluice.DispatchServer()
    servers = [sluice.WorkerServer(dispatcher_address=dispatcher.address) for _ in range(workers)]
    return dispatcher, servers


def _stop(dispatcher, servers):
    for w in servers:
        w.stop()
    dispatcher.stop()


def test_a_distributed_epoch_position_resumes_on_a_fresh_service(hang_guard):
    n = 1000
    first, workers = _fresh_service(2)
    try:
        ds = sluice.Dataset.range(n).map(x * 2).distribute("distributed_epoch", first.target)
        it = ds.make_iterator()
        seen = [int(next(it)) for _ in range(300)]
        checkpoint = it.save()
        next(it)  # read past the checkpoint: not part of it
        it.close()
    finally:
        _stop(first, workers)
    second, workers = _fresh_service(1)
    try:
        # Another address: a checkpoint holds the pipeline, not where it ran.
        ds = sluice.Dataset.range(n).map(x * 2).distribute("distributed_epoch", second.target)
        seen += [int(e) for e in ds.make_iterator(checkpoint=checkpoint)]
    finally:
        _stop(second, workers)
    assert sorted(seen) == list(range(0, 2 * n, 2))


def test_saving_a_parallel_epochs_position_says_why_not(service):
    it = sluice.Dataset.range(10).distribute("parallel_epochs", service.target).make_iterator()
    next(it)
    with pytest.raises(NotImplementedError, match="distributed_epoch"):
        it.save()
    it.close()


def test_torch_ranks_state_dicts_merge_and_resume_the_job(hang_guard):
    import sluice.torch as st
    n = 600
    first, workers = _fresh_service(2)
    got = []
    try:
        ranks = [st.IterableDataset(
            sluice.Dataset.range(n).distribute("distributed_epoch", first.target,
                                               job_name="train")) for _ in range(2)]
        its = [iter(r) for r in ranks]
        for _ in range(50):
            for it in its:
                got.append(int(next(it)))
        merged = st.merge_state_dicts([r.state_dict() for r in ranks])
        for it in its:
            it.close()
    finally:
        _stop(first, workers)
    second, workers = _fresh_service(1)
    try:
        resumed = st.IterableDataset(
            sluice.Dataset.range(n).distribute("distributed_epoch", second.target,
                                               job_name="train"))
        resumed.load_state_dict(merged)
        got += [int(v) for v in resumed]
    finally:
        _stop(second, workers)
    assert sorted(got) == list(range(n))
    assert st.merge_state_dicts([{}, {}]) == {}
    with pytest.raises(ValueError):
        sluice.merge_checkpoints([merged["sluice_checkpoint"], b"junk"])
