"""sluice.load_plugin: C++ UDF plugins loaded into the Python process.

The plugin is tests/dataset/test_plugin.cc (UDF plugin_double: int64 x -> 2x),
built as <build>/tests/dataset/libsluice_test_plugin.so: $SLUICE_TEST_PLUGIN,
else found from the build tree's package (<build>/python/sluice).
"""

import os

import pytest

import sluice
from sluice import x


def _test_plugin(name="libsluice_test_plugin.so"):
    env = os.environ.get("SLUICE_TEST_PLUGIN")
    if env and name == "libsluice_test_plugin.so":
        return env
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(sluice.__file__))))
    return os.path.join(build, "tests", "dataset", name)


@pytest.fixture(scope="module")
def plugin():
    path = _test_plugin()
    if not os.path.exists(path):
        pytest.skip(f"the test plugin is not built ({path}; set SLUICE_TEST_PLUGIN)")
    return path


def test_load_plugin_registers_its_udfs(plugin):
    sluice.load_plugin(plugin)
    sluice.load_plugin(plugin)  # loading again is a no-op
    ds = sluice.Dataset.range(4).map(sluice.udf("plugin_double"))
    assert [int(e) for e in ds] == [0, 2, 4, 6]
    # A UDF composes with expressions like any map.
    assert [int(e) for e in sluice.Dataset.range(3).map(sluice.udf("plugin_double")).map(x + 1)] \
        == [1, 3, 5]


def test_a_second_plugin_with_the_same_udf_is_refused(plugin):
    sluice.load_plugin(plugin)
    dup = _test_plugin("libsluice_test_plugin_dup.so")
    if not os.path.exists(dup):
        pytest.skip(f"{dup} is not built")
    with pytest.raises(RuntimeError, match="UDF 'plugin_double' is already registered"):
        sluice.load_plugin(dup)


def test_bad_plugin_paths_are_clear_errors(tmp_path):
    with pytest.raises(sluice.NotFoundError, match="does not exist"):
        sluice.load_plugin("/nonexistent/libnothing.so")
    not_a_library = tmp_path / "not_a_library.so"
    not_a_library.write_text("just text")
    with pytest.raises(ValueError, match="cannot load plugin"):
        sluice.load_plugin(str(not_a_library))


def test_unknown_udf_names_the_function():
    with pytest.raises(ValueError, match="unknown function 'no_such_udf'"):
        sluice.Dataset.range(3).map(sluice.udf("no_such_udf"))
