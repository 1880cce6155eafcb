"""C++ errors become Python exceptions with the library's message."""

import numpy as np
import pytest

import sluice
from sluice import x


def test_bad_definition_is_a_value_error_at_the_step():
    with pytest.raises(ValueError, match=r"^Shard: index must be in \[0, 2\); got 7$"):
        sluice.Dataset.range(5).shard(2, 7)
    with pytest.raises(ValueError, match="Map: op 'add': fractional literal 0.5"):
        sluice.Dataset.range(5).map(x + 0.5)
    with pytest.raises(ValueError, match="dtype mismatch"):
        sluice.Dataset.range(5).map(x + np.float32(1))
    with pytest.raises(ValueError, match="unknown dtype 'complex'"):
        x.cast("complex")


def test_runtime_errors_locally():
    ds = sluice.Dataset.range(5).map(10 / (x - 2))
    it = iter(ds)
    assert int(next(it)) == -5 and int(next(it)) == -10
    with pytest.raises(ValueError, match="integer division by zero"):
        next(it)
    with pytest.raises(ValueError, match="integer division by zero"):
        next(it)  # the iterator keeps its error


def test_not_found_is_file_not_found_and_lookup_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no files match") as info:
        list(sluice.Dataset.list_files(str(tmp_path / "*.none")))
    assert isinstance(info.value, LookupError)
    assert isinstance(info.value, sluice.NotFoundError)
    with pytest.raises(FileNotFoundError):
        sluice.image.image_folder(str(tmp_path))  # no class directories
    with pytest.raises(ValueError, match="Map: unknown function 'unknown_udf'"):
        sluice.Dataset.range(3).map(sluice.udf("unknown_udf"))


def test_runtime_error_on_a_worker(service):
    ds = sluice.Dataset.range(5).map(10 / (x - 2)).distribute(service=service.target)
    with pytest.raises(ValueError, match="integer division by zero"):
        list(ds)


def test_service_errors(service):
    with pytest.raises(LookupError, match="dataset 'missing' is not registered"):
        list(sluice.Dataset.from_dataset_id("parallel_epochs", service.target, "missing"))
    with pytest.raises(ValueError, match="unknown processing_mode 'bogus'"):
        list(sluice.Dataset.range(3).distribute("bogus", service.target))
    list(sluice.Dataset.range(3).distribute(service=service.target, job_name="errors_job"))
    with pytest.raises(ValueError, match="job 'errors_job' exists"):
        list(sluice.Dataset.range(4).distribute(service=service.target, job_name="errors_job"))


def test_unreachable_dispatcher_is_a_connection_error():
    dispatcher = sluice.DispatchServer()
    port = dispatcher.port
    dispatcher.stop()
    ds = sluice.Dataset.range(3).distribute(service=f"grpc://127.0.0.1:{port}",
                                            dispatcher_timeout_ms=300)
    with pytest.raises(ConnectionError, match="cannot reach the sluice dispatcher"):
        list(ds)
    with pytest.raises(ValueError, match="stopped"):
        dispatcher.target


def test_bad_keyword_arguments_are_type_errors():
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        sluice.Dataset.range(3).distribute(service="grpc://h:1", bogus=1)
    with pytest.raises(TypeError, match="max_outstanding_requests cannot be a str"):
        sluice.Dataset.range(3).distribute(service="grpc://h:1", max_outstanding_requests="8")
    with pytest.raises(TypeError, match="needs dispatcher_address"):
        sluice.WorkerServer()
    with pytest.raises(TypeError, match="unexpected keyword argument 'prt'"):
        sluice.DispatchServer(prt=0)
