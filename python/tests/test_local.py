"""The dataset builder, expressions and local iteration."""

import io as _pyio

import numpy as np
import pytest

import sluice
from sluice import x


def ints(ds):
    return [int(e) for e in ds]


def test_seed_example_locally():
    ds = sluice.Dataset.range(5).map(x * x).map(x + 1)
    got = list(ds)
    assert [int(e) for e in got] == [1, 2, 5, 10, 17]
    assert all(isinstance(e, np.ndarray) and e.dtype == np.int64 and e.shape == () for e in got)


def test_sources():
    assert ints(sluice.Dataset.range(2, 11, 3)) == [2, 5, 8]
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    ds = sluice.Dataset.from_tensors([(a, np.int32(1), b"one"), (a * 2, np.int32(2), "two")])
    out = list(ds)
    assert len(out) == 2
    np.testing.assert_array_equal(out[1][0], a * 2)
    assert out[1][1].dtype == np.int32 and out[1][1].shape == () and int(out[1][1]) == 2
    assert [e.shape for e in sluice.Dataset.from_tensors([np.int64(7), 8])] == [(), ()]
    assert out[0][2] == b"one" and out[1][2] == b"two"
    strings = list(sluice.Dataset.from_tensors([np.array([[b"a", b"bc"], [b"", b"d"]])]))
    assert strings == [[[b"a", b"bc"], [b"", b"d"]]]
    zipped = list(sluice.Dataset.zip(sluice.Dataset.range(3), sluice.Dataset.range(10, 20)))
    assert [(int(a), int(b)) for a, b in zipped] == [(0, 10), (1, 11), (2, 12)]
    assert len(list(sluice.Dataset.zip([sluice.Dataset.range(2)] * 3))) == 2


def test_list_files(tmp_path):
    for name in ["b.txt", "a.txt", "c.bin"]:
        (tmp_path / name).write_bytes(name.encode())
    files = list(sluice.Dataset.list_files(str(tmp_path / "*.txt")))
    assert files == [str(tmp_path / "a.txt").encode(), str(tmp_path / "b.txt").encode()]
    contents = list(sluice.Dataset.list_files(str(tmp_path / "*.txt")).map(sluice.io.read_file(x)))
    assert contents == [b"a.txt", b"b.txt"]


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                   np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                                   np.float64])
def test_dtypes_round_trip(dtype):
    a = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    (out,) = list(sluice.Dataset.from_tensors([a]))
    assert out.dtype == a.dtype and out.shape == (3, 4)
    np.testing.assert_array_equal(out, a)
    assert not out.flags.writeable  # views of storage the pipeline may share


def test_transforms():
    r = sluice.Dataset.range
    assert ints(r(10).filter(x % 3 == 0)) == [0, 3, 6, 9]
    batches = list(r(7).batch(3))
    assert [b.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [b.tolist() for b in r(7).batch(3, drop_remainder=True)] == [[0, 1, 2], [3, 4, 5]]
    assert ints(r(7).batch(3).unbatch()) == list(range(7))
    assert ints(r(3).repeat(2)) == [0, 1, 2, 0, 1, 2]
    assert ints(r(10).skip(2).take(3)) == [2, 3, 4]
    assert ints(r(10).shard(3, 1)) == [1, 4, 7]
    assert ints(r(5).prefetch(2)) == list(range(5))
    assert ints(r(5).prefetch(sluice.AUTOTUNE)) == list(range(5))
    assert [(int(i), int(v)) for i, v in r(3, 6).enumerate(start=10)] == [(10, 3), (11, 4), (12, 5)]
    assert ints(r(20).map(x * 2, num_parallel_calls=sluice.AUTOTUNE)) == list(range(0, 40, 2))
    assert sorted(ints(r(20).map(x * 2, num_parallel_calls=2, deterministic=False))) == \
        list(range(0, 40, 2))
    interleaved = ints(r(3).interleave(lambda d: d.repeat(2), cycle_length=2))
    assert interleaved == [0, 1, 0, 1, 2, 2]


def test_shuffle():
    ds = sluice.Dataset.range(100).shuffle(10, seed=7, reshuffle_each_iteration=False)
    a, b = ints(ds), ints(ds)
    assert sorted(a) == list(range(100)) and a == b and a != list(range(100))


def test_inspection():
    ds = sluice.Dataset.range(10).map((x, x.cast(np.float32))).batch(4)
    assert ds.cardinality() == 3
    assert sluice.Dataset.range(3).repeat().cardinality() == sluice.INFINITE_CARDINALITY
    assert sluice.Dataset.range(3).filter(x > 0).cardinality() == sluice.UNKNOWN_CARDINALITY
    spec = ds.element_spec
    assert isinstance(spec, tuple) and len(spec) == 2
    assert spec[0].dtype == "int64" and spec[1].dtype == "float32"
    assert spec[0].shape == (None,)  # the last batch may be smaller
    assert sluice.Dataset.range(3).element_spec.shape == ()
    same = sluice.Dataset.range(10).map((x, x.cast(np.float32))).batch(4)
    assert ds.fingerprint() == same.fingerprint()
    assert ds.fingerprint() != sluice.Dataset.range(11).fingerprint()
    back = sluice.Dataset.deserialize(ds.serialize())
    assert back.fingerprint() == ds.fingerprint()
    assert "batch" in repr(ds)


def test_expressions():
    r = sluice.Dataset.range(5)
    assert ints(r.map(x + 1)) == [1, 2, 3, 4, 5]
    assert ints(r.map(10 - x)) == [10, 9, 8, 7, 6]
    assert ints(r.map(-x * 3)) == [0, -3, -6, -9, -12]
    assert ints(r.map((x - 2) / 2)) == [-1, 0, 0, 0, 1]  # truncates toward zero, as C++
    assert ints(r.map(7 % (x + 1))) == [0, 1, 1, 3, 2]
    assert ints(r.map(sluice.min(x, 2))) == [0, 1, 2, 2, 2]
    assert ints(r.map(sluice.max(x, 3))) == [3, 3, 3, 3, 4]
    assert ints(r.map(sluice.abs(x - 2))) == [2, 1, 0, 1, 2]
    assert ints(r.map(abs(x - 2))) == [2, 1, 0, 1, 2]
    assert ints(r.filter((x > 0) & (x < 4))) == [1, 2, 3]
    assert ints(r.filter((x == 0) | (x >= 4))) == [0, 4]
    assert ints(r.filter(~(x != 2))) == [2]
    assert ints(r.filter(x <= 1)) == [0, 1]
    assert ints(r.filter(True)) == list(range(5))
    floats = list(r.map(x.cast("float32") * 0.5))
    assert floats[3].dtype == np.float32 and float(floats[3]) == 1.5
    assert list(r.map(x.cast(np.float64) / 4))[2].dtype == np.float64
    # Weak literals adopt the other operand's dtype.
    small = list(r.map(x.cast(np.int8) + 1))
    assert small[0].dtype == np.int8
    # Strong constants keep theirs: numpy scalars and arrays.
    vec = list(r.take(2).map(x.cast(np.float32) + np.array([1, 2], dtype=np.float32)))
    np.testing.assert_array_equal(vec[1], np.array([2, 3], dtype=np.float32))
    # Tuples in and out; a callable is traced once with x.
    pairs = list(r.map((x, x * x)).map(lambda e: (e[1], e[0] + 100)))
    assert [(int(a), int(b)) for a, b in pairs][2] == (4, 102)
    assert repr(x) == "sluice.x"


def test_expression_misuse_is_a_type_error():
    with pytest.raises(TypeError, match="no truth value"):
        bool(x > 1)
    with pytest.raises(TypeError, match="no truth value"):
        sluice.Dataset.range(3).filter(1 < x < 2)
    with pytest.raises(TypeError, match="no '//'"):
        x // 2
    with pytest.raises(TypeError, match="only x can be indexed"):
        (x + 1)[0]


def _png(rgb):
    from PIL import Image
    buf = _pyio.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def test_images(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(40, 60, 3), dtype=np.uint8)
    png = _png(pixels)
    (decoded,) = list(sluice.Dataset.from_tensors([png]).map(sluice.image.decode(x)))
    np.testing.assert_array_equal(decoded, pixels)
    ds = sluice.Dataset.from_tensors([png]).map(sluice.image.decode(x))
    (crop,) = list(ds.map(sluice.image.center_crop(x, 20, 30)))
    np.testing.assert_array_equal(crop, pixels[10:30, 15:45])
    (small,) = list(ds.map(sluice.image.resize(x, 20)))
    assert small.shape == (20, 30, 3)
    (rrc,) = list(ds.with_seed(1).map(sluice.image.random_resized_crop(x, 16, 16)))
    assert rrc.shape == (16, 16, 3) and rrc.dtype == np.uint8
    (flipped,) = list(ds.with_seed(1).map(sluice.image.random_horizontal_flip(x, p=1.0)))
    np.testing.assert_array_equal(flipped, pixels[:, ::-1])
    (norm,) = list(ds.map(sluice.image.normalize(x, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))))
    assert norm.shape == (3, 40, 60) and norm.dtype == np.float32
    np.testing.assert_allclose(norm, (pixels.transpose(2, 0, 1) / 255.0 - 0.5) / 0.25, atol=1e-5)

    for cls, n in [("cat", 2), ("dog", 1)]:
        (tmp_path / cls).mkdir()
        for i in range(n):
            (tmp_path / cls / f"{i}.png").write_bytes(png)
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    assert sluice.image.folder_classes(str(tmp_path)) == ["cat", "dog"]
    folder = sluice.image.image_folder(str(tmp_path))
    items = [(p, int(label)) for p, label in folder]
    assert [label for _, label in items] == [0, 0, 1]
    assert items[2][0] == str(tmp_path / "dog" / "0.png").encode()
    shapes = [img.shape for img, _ in folder.map(
        (sluice.image.decode(sluice.io.read_file(x[0])), x[1]))]
    assert shapes == [(40, 60, 3)] * 3


def test_an_iterator_saved_midway_resumes_where_it_was():
    ds = sluice.Dataset.range(20).shuffle(8).map(x * 10).batch(3)
    it = ds.make_iterator()
    first = [next(it).tolist() for _ in range(2)]
    checkpoint = it.save()
    assert isinstance(checkpoint, bytes)
    rest = [b.tolist() for b in it]
    resumed = [b.tolist() for b in ds.make_iterator(checkpoint=checkpoint)]
    assert resumed == rest
    assert sorted(v for b in first + rest for v in b) == [v * 10 for v in range(20)]
    with pytest.raises(ValueError, match="another pipeline"):
        sluice.Dataset.range(21).make_iterator(checkpoint=checkpoint)
    # What a prefetch thread holds ahead is saved too.
    prefetched = sluice.Dataset.range(5).prefetch(2)
    p = prefetched.make_iterator()
    next(p)
    assert ints(prefetched.make_iterator(checkpoint=p.save())) == [1, 2, 3, 4]


def _write_shard(path, samples, mode="w"):
    """A WebDataset shard written by the standard library's tarfile, as the
    webdataset library's writer does: members <key>.<field>, in sample order."""
    import tarfile
    with tarfile.open(path, mode) as tar:
        for key, fields in samples:
            for field, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size = len(data)
                tar.addfile(info, _pyio.BytesIO(data))


def test_webdataset_reads_tarfile_shards(tmp_path):
    shards = []
    for s in range(3):
        samples = [(f"s{s}/{i:04d}", {"jpg": b"image %d %d" % (s, i), "cls": b"%d" % s,
                                      "json": b"{}"}) for i in range(4)]
        mode = "w:gz" if s == 2 else "w"  # compressed shards read the same
        path = tmp_path / (f"shard-{s}.tar" + (".gz" if s == 2 else ""))
        _write_shard(path, samples, mode)
        shards.append(path)
    want = [(b"s%d/%04d" % (s, i), b"image %d %d" % (s, i), b"%d" % s)
            for s in range(3) for i in range(4)]
    pattern = sluice.Dataset.webdataset(str(tmp_path / "shard-*"), ["__key__", "jpg", "cls"])
    assert [tuple(bytes(c) for c in e) for e in pattern] == want
    listed = sluice.Dataset.webdataset(shards, ["__key__", "jpg", "cls"])  # pathlib paths
    assert [tuple(bytes(c) for c in e) for e in listed] == want
    names = sluice.Dataset.from_tensors([str(p) for p in shards])
    assert len(list(sluice.Dataset.webdataset(names, ["cls"]))) == 12


def test_webdataset_incomplete_samples_and_bad_shards(tmp_path):
    shard = tmp_path / "a.tar"
    _write_shard(shard, [("a", {"jpg": b"1", "cls": b"0"}), ("b", {"jpg": b"2"}),
                         ("c", {"jpg": b"3", "cls": b"1"})])
    with pytest.raises(ValueError, match=r"sample 'b' of shard '.*a.tar'.* has no 'cls' member"):
        list(sluice.Dataset.webdataset(str(shard), ["jpg", "cls"]))
    got = sluice.Dataset.webdataset(str(shard), ["jpg", "cls"], skip_incomplete=True)
    assert [bytes(e[0]) for e in got] == [b"1", b"3"]
    with pytest.raises(ValueError, match="name at least one field"):
        sluice.Dataset.webdataset(str(shard), [])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shard.read_bytes()[:1200])
    with pytest.raises(RuntimeError, match=r"shard '.*cut.tar' is truncated or corrupt at byte"):
        list(sluice.Dataset.webdataset(str(cut), ["jpg"]))
    with pytest.raises(FileNotFoundError):
        list(sluice.Dataset.webdataset([tmp_path / "missing.tar"], ["jpg"]))


def test_list_files_recursive_and_image_folder_at_any_depth(tmp_path):
    (tmp_path / "cat" / "tabby").mkdir(parents=True)
    (tmp_path / "dog").mkdir()
    for f in ["cat/1.jpg", "cat/tabby/2.jpg", "dog/3.png", "top.jpg"]:
        (tmp_path / f).write_bytes(b"x")
    got = [bytes(e).decode() for e in sluice.Dataset.list_files(str(tmp_path / "*"), recursive=True)]
    assert got == [str(tmp_path / f) for f in ["cat/1.jpg", "cat/tabby/2.jpg", "dog/3.png", "top.jpg"]]
    folder = [(bytes(p).decode(), int(l)) for p, l in sluice.image.image_folder(str(tmp_path))]
    assert folder == [(str(tmp_path / "cat/1.jpg"), 0), (str(tmp_path / "cat/tabby/2.jpg"), 0),
                      (str(tmp_path / "dog/3.png"), 1)]
